"""kvmatrix harness, in layers: entry points (cli/, the pytest plugin) over run/ (a cell's path in stages), matrix/
(matrix model and files), oracles/ (one module per oracle), and at the bottom sut/ (the systems under test, one
package per engine) and results/ (the run record)."""
