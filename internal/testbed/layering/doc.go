// Package layering holds the test of the house's floors (docs/architecture.md, "Packages"): no
// production package imports one on a floor above its own, none imports a test server, and the
// rule model and the aggregator link no bucket store. It has no code of its own: the floors are
// what its test reads from the import graph.
package layering
