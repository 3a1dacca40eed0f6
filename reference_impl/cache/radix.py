"""The L1 (device) radix prefix cache: whole pages of token ids → KV pages, plus Mamba snapshots.

Pages and snapshot slots are plain ints handed in by the caller; the tree never allocates.
A dense cache hits as deep as the KV matches. A hybrid cache (``free_state`` given) hits only
as deep as the deepest node on the matched path that owns a state snapshot, because a Mamba
state cannot be split (SGLang ``MambaRadixCache``). A snapshot is valid at its node's END.

Ownership of pages and slots, step by step:
- ``match_prefix`` hands out nothing. ``MatchResult.pages`` and ``.state_slot`` stay the
  tree's and are safe to read only while the caller holds ``lock(result.node)``; the caller
  copies ``state_slot`` into its own slot (copy-on-write) and never writes the tree's slot.
- ``insert`` adopts the caller's pages for positions >= ``existing_tokens`` and the snapshot
  slots for positions that had none. ``unused_pages`` / ``unused_slots`` stay the caller's,
  who frees them. A caller page (or slot) that IS the tree's own at that position — a page
  from an earlier ``match_prefix`` — is in neither list: it was the tree's all along.
- ``evict`` gives each evicted node's pages to ``free_pages`` and its slot to ``free_state``,
  exactly once, and forgets them.
- ``lock`` / ``unlock`` move no ownership; they pin a path against ``evict``.
- ``load_back(tokens, match)`` commits a tiered cache's ``match.pending`` once the caller has
  made room: it returns a longer match (whose node the caller locks instead), or ``match``.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from reference_impl.faults import EVICT_COUNTS_LEAVES, EVICT_IGNORES_LOCK, SPLIT_SNAPSHOT_TO_HEAD


class CacheIntegrityError(AssertionError):
    """The tree broke an invariant, or a caller broke the lock protocol (stale node, unlock underflow)."""


@dataclass(slots=True, eq=False)
class TreeNode:
    """One edge of the tree: ``key`` tokens stored in ``pages``, and a snapshot valid at its end."""

    id: int
    key: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    parent: TreeNode | None = None
    children: dict[tuple[int, ...], TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0
    state_slot: int | None = None


@dataclass(slots=True)
class MatchResult:
    """The cached prefix of a query; its pages and slot are the tree's (see the ownership notes)."""

    pages: list[int]
    matched_tokens: int
    node: TreeNode
    state_slot: int | None
    host_tokens: int = 0     # of matched_tokens, how many L2 (host) loaded back into L1
    storage_tokens: int = 0  # of matched_tokens, how many L3 (storage) loaded back through L2 into L1
    pending: object | None = None  # a load-back from the tiers below that ``load_back`` may commit


@dataclass(slots=True)
class InsertResult:
    """What ``insert`` found cached already, and which of the caller's pages/slots it did not adopt."""

    existing_tokens: int
    unused_pages: list[int]
    unused_slots: list[int]


def _check_insert_args(
    page_size: int, hybrid: bool, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int]
) -> None:
    """Raise ValueError, naming the input, unless tokens/pages/snapshots describe whole cached pages."""
    if len(tokens) % page_size or len(tokens) != len(pages) * page_size:
        raise ValueError(
            f"insert needs len(tokens) == len(pages) * page_size: got {len(tokens)} tokens, "
            f"{len(pages)} pages, page_size {page_size}"
        )
    if len(set(pages)) != len(pages):
        raise ValueError(f"insert got a page id more than once: {list(pages)}")
    if snapshots and not hybrid:
        raise ValueError(f"snapshots at positions {sorted(snapshots)} given to a dense cache (no free_state)")
    for pos in snapshots:
        if not 0 < pos <= len(tokens) or pos % page_size:
            raise ValueError(
                f"snapshot position {pos} must be a multiple of page_size {page_size} in (0, {len(tokens)}]"
            )
    if len(set(snapshots.values())) != len(snapshots):
        raise ValueError(f"insert got a snapshot slot more than once: {dict(snapshots)}")


class RadixCache:
    """Page-granular radix tree of cached prefixes with LRU eviction of unlocked leaves."""

    lower_tiers: tuple[str, ...] = ()  # tiers below L1 (cache=host adds "host")

    def __init__(
        self,
        page_size: int,
        free_pages: Callable[[list[int]], None],
        free_state: Callable[[int], None] | None = None,
    ) -> None:
        """Build an empty cache; ``free_state`` given makes it hybrid (hits need a snapshot)."""
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self._free_pages = free_pages
        self._free_state = free_state
        self._ids = itertools.count()
        self._clock = 0  # logical LRU clock: deterministic, unlike wall time
        self._root = TreeNode(next(self._ids))
        self._pages: set[int] = set()
        self._slots: set[int] = set()
        self._evictable = 0
        self.faults: frozenset[str] = frozenset()
        self.evicted_pages = 0  # pages L1 has evicted so far (tests check that pressure really evicts)

    @property
    def is_hybrid(self) -> bool:
        """Whether hits must end at a Mamba state snapshot."""
        return self._free_state is not None

    def attach(self, mover: object, host_pages: int | None = None) -> None:
        """Take the engine's faults from its page mover; L1 alone copies no page anywhere and has no L2."""
        self.faults = frozenset(getattr(mover, "faults", ()))

    def load_back(self, tokens: Sequence[int], match: MatchResult) -> MatchResult:
        """No tier below L1: nothing to load, the match stands."""
        return match

    def match_prefix(self, tokens: Sequence[int]) -> MatchResult:
        """Longest cached whole-page prefix of ``tokens`` (hybrid: cut back to the deepest snapshot)."""
        path, partial = self._walk(tokens)
        if self.is_hybrid:
            while path and path[-1].state_slot is None:
                path.pop()
        elif partial is not None:
            path.append(self._split(*partial))  # so the returned node ends exactly at the hit
        self._touch(path)
        node = path[-1] if path else self._root
        pages = [page for n in path for page in n.pages]
        return MatchResult(pages, len(pages) * self.page_size, node, node.state_slot)

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int] | None = None
    ) -> InsertResult:
        """Cache ``tokens`` stored in ``pages``; adopt what is new, hand back what was cached already."""
        snapshots = dict(snapshots or {})
        _check_insert_args(self.page_size, self.is_hybrid, tokens, pages, snapshots)
        tokens, pages = list(tokens), list(pages)
        path, partial = self._walk(tokens)
        if partial is not None:
            path.append(self._split(*partial))  # splits keep every invariant, so raising below is safe
        existing = sum(len(n.key) for n in path)
        tree_pages = [page for n in path for page in n.pages]
        unused_pages = [mine for mine, theirs in zip(pages, tree_pages) if mine != theirs]
        new_pages = pages[existing // self.page_size:]
        held = sorted(self._pages.intersection(new_pages + unused_pages))
        if held:
            raise ValueError(f"insert got pages {held} that the tree already owns at other positions")
        slot_at = self._slots_by_end(path)
        stolen = sorted(s for p, s in snapshots.items() if s in self._slots and slot_at.get(p) != s)
        if stolen:
            raise ValueError(f"insert got snapshot slots {stolen} that the tree already owns at other positions")
        if new_pages:
            parent = path[-1] if path else self._root
            leaf = TreeNode(next(self._ids), tokens[existing:], new_pages, parent)
            parent.children[self._child_key(leaf.key)] = leaf
            self._pages.update(new_pages)
            self._evictable += len(new_pages)
        unused_slots = self._adopt_snapshots(tokens, snapshots, slot_at)
        self._touch(self._walk(tokens)[0])
        return InsertResult(existing, unused_pages, unused_slots)

    def lock(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors so ``evict`` leaves the matched pages alone."""
        for n in self._path_to_root(node):
            if n.lock_ref == 0:
                self._evictable -= len(n.pages)
            n.lock_ref += 1

    def unlock(self, node: TreeNode) -> None:
        """Release one ``lock(node)``; the path becomes evictable when no lock holds it."""
        path = self._path_to_root(node)
        if path and path[0].lock_ref <= 0:
            raise CacheIntegrityError(f"unlock of node {node.id}, which holds no lock")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self._evictable += len(n.pages)

    def evict(self, num_pages: int) -> int:
        """Free least-recently-used unlocked leaves until ``num_pages`` are freed or none is left."""
        pinned = (lambda n: False) if EVICT_IGNORES_LOCK.name in self.faults else (lambda n: n.lock_ref > 0)
        heap = [(n.last_access, n.id, n) for n in self._nodes() if not n.children and not pinned(n)]
        heapq.heapify(heap)  # ties on the clock go to the older node id: deterministic
        freed = 0
        while freed < num_pages and heap:
            node = heapq.heappop(heap)[2]
            parent = node.parent
            removed = self._remove_leaf(node)
            freed += 1 if EVICT_COUNTS_LEAVES.name in self.faults else removed  # the fault: leaves, not pages
            if parent is not self._root and not parent.children and not pinned(parent):
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def evictable_pages(self) -> int:
        """Pages that no lock pins, all of which ``evict`` can free."""
        return self._evictable

    def cached_pages(self) -> int:
        """Pages the tree owns."""
        return len(self._pages)

    def cached_states(self) -> int:
        """Snapshot slots the tree owns."""
        return len(self._slots)

    def check_integrity(self) -> None:
        """Recount the tree and raise CacheIntegrityError naming the first broken invariant."""
        root = self._root
        if root.key or root.pages or root.state_slot is not None or root.lock_ref or root.parent:
            raise CacheIntegrityError("root must hold no tokens, pages, snapshot, lock or parent")
        pages: set[int] = set()
        slots: set[int] = set()
        evictable = 0
        for node in self._nodes():
            self._check_node(node)
            repeated = pages.intersection(node.pages) or len(set(node.pages)) != len(node.pages)
            if repeated:
                raise CacheIntegrityError(f"node {node.id} holds page(s) {node.pages} also held elsewhere")
            pages.update(node.pages)
            if node.state_slot is not None:
                if node.state_slot in slots:
                    raise CacheIntegrityError(f"snapshot slot {node.state_slot} is held by two nodes")
                slots.add(node.state_slot)
            evictable += len(node.pages) if node.lock_ref == 0 else 0
        if pages != self._pages or slots != self._slots or evictable != self._evictable:
            raise CacheIntegrityError(
                f"counters disagree with a recount: pages {len(self._pages)} vs {len(pages)}, "
                f"slots {len(self._slots)} vs {len(slots)}, evictable {self._evictable} vs {evictable}"
            )

    def _check_node(self, node: TreeNode) -> None:
        """Raise unless one non-root node is well-formed and consistently linked to its parent."""
        parent = node.parent
        if parent is None or parent.children.get(self._child_key(node.key)) is not node:
            raise CacheIntegrityError(f"node {node.id} is not keyed by its first page under its parent")
        if not node.key or len(node.key) != len(node.pages) * self.page_size:
            raise CacheIntegrityError(
                f"node {node.id} holds {len(node.key)} tokens in {len(node.pages)} pages of {self.page_size}"
            )
        if node.lock_ref < 0 or (parent is not self._root and parent.lock_ref < node.lock_ref):
            raise CacheIntegrityError(
                f"node {node.id} has lock {node.lock_ref} under a parent with lock {parent.lock_ref}"
            )
        if node.state_slot is not None and not self.is_hybrid:
            raise CacheIntegrityError(f"node {node.id} of a dense cache holds snapshot {node.state_slot}")

    def _child_key(self, tokens: Sequence[int], start: int = 0) -> tuple[int, ...]:
        """Children are keyed by their first page of tokens."""
        return tuple(tokens[start : start + self.page_size])

    def _walk(self, tokens: Sequence[int]) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
        """Nodes fully matched by ``tokens``, and (child, matched tokens) where a match stops inside one."""
        node, pos, path = self._root, 0, []
        while len(tokens) - pos >= self.page_size:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            length = self._match_len(child.key, tokens, pos)
            if length < len(child.key):
                return path, (child, length)
            path.append(child)
            node, pos = child, pos + length
        return path, None

    def _match_len(self, key: list[int], tokens: Sequence[int], start: int) -> int:
        """Tokens of ``key`` that ``tokens[start:]`` matches, rounded down to whole pages."""
        limit = min(len(key), len(tokens) - start)
        i = 0
        while i < limit and key[i] == tokens[start + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, node: TreeNode, length: int) -> TreeNode:
        """Move ``node``'s first ``length`` tokens into a new parent, which it returns."""
        parent = node.parent
        cut = length // self.page_size
        # ``node`` keeps its end (snapshot, and the identity callers hold locks by), so the new
        # parent inherits its lock count and clock: every lock on ``node`` also pins the parent.
        head = TreeNode(
            next(self._ids), node.key[:length], node.pages[:cut], parent,
            lock_ref=node.lock_ref, last_access=node.last_access,
        )
        parent.children[self._child_key(head.key)] = head
        if SPLIT_SNAPSHOT_TO_HEAD.name in self.faults:  # the snapshot of position end(node) now claims end(head)
            head.state_slot, node.state_slot = node.state_slot, None
        node.key, node.pages, node.parent = node.key[length:], node.pages[cut:], head
        head.children[self._child_key(node.key)] = node
        return head

    def _slots_by_end(self, path: list[TreeNode]) -> dict[int, int]:
        """Snapshot slots on ``path``, keyed by the absolute token position where their node ends."""
        slots, end = {}, 0
        for node in path:
            end += len(node.key)
            if node.state_slot is not None:
                slots[end] = node.state_slot
        return slots

    def _adopt_snapshots(self, tokens: list[int], snapshots: dict[int, int], slot_at: dict[int, int]) -> list[int]:
        """Adopt each snapshot whose position has none yet (splitting so a node ends there); return the rest."""
        unused = []
        for pos in sorted(snapshots):
            slot = snapshots[pos]
            if pos in slot_at:
                if slot_at[pos] != slot:
                    unused.append(slot)
                continue
            path, partial = self._walk(tokens[:pos])
            node = self._split(*partial) if partial is not None else path[-1]
            node.state_slot = slot
            self._slots.add(slot)
        return unused

    def _touch(self, path: list[TreeNode]) -> None:
        """Stamp a used path with the next tick of the logical clock."""
        self._clock += 1
        for node in path:
            node.last_access = self._clock

    def _path_to_root(self, node: TreeNode) -> list[TreeNode]:
        """``node`` and its non-root ancestors; raise if ``node`` is not (or no longer) in this tree."""
        path = []
        while node is not self._root:
            parent = node.parent
            if parent is None or parent.children.get(self._child_key(node.key)) is not node:
                raise CacheIntegrityError(f"node {node.id} is not in this tree (evicted, or another cache's)")
            path.append(node)
            node = parent
        return path

    def _nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, depth first, in a deterministic order."""
        stack = list(reversed(self._root.children.values()))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children.values()))

    def _remove_leaf(self, node: TreeNode) -> int:
        """Detach an unlocked leaf and give its pages (and snapshot) back; return pages freed."""
        del node.parent.children[self._child_key(node.key)]
        self._pages.difference_update(node.pages)
        self._evictable -= len(node.pages)
        self.evicted_pages += len(node.pages)
        self._free_pages(list(node.pages))
        if node.state_slot is not None:
            self._slots.discard(node.state_slot)
            self._free_state(node.state_slot)
        return len(node.pages)


class NoCache(RadixCache):
    """cache=off: a RadixCache that adopts nothing, so its tree stays empty and every match misses."""

    def insert(
        self, tokens: Sequence[int], pages: Sequence[int], snapshots: Mapping[int, int] | None = None
    ) -> InsertResult:
        """Validate like RadixCache, adopt nothing, and hand every page and slot back."""
        snapshots = dict(snapshots or {})
        _check_insert_args(self.page_size, self.is_hybrid, tokens, pages, snapshots)
        return InsertResult(0, list(pages), [snapshots[pos] for pos in sorted(snapshots)])
