// Package ts holds @quotaflow/client, the TypeScript client of the check API (an npm package in
// this folder, beside the Go client), and the Go tests that build it and run its tests with
// Node against a real checker process on a real Redis: `go test ./checker/client/ts/`, part of
// make test. The package has no Go code of its own.
package ts
