# quotaflow — `make dev` runs the pipeline on 127.0.0.1:8080, `make test` runs every test.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/quotaflow

.PHONY: dev test test-cluster test-shared deps build generate generate-ts console vet fuzz fuzz-ci bench bench-ts clean

## dev: install what is missing, check the ports are free, build, start Redis, ClickHouse and
## quotaflow serve, stop all on Ctrl-C (deploy/dev/run.sh builds, after the port check)
dev: deps
	@bash deploy/dev/run.sh

## test: install what is missing, then vet, run the whole suite against real servers, the
## decision engine's packages again on a Redis Cluster (test-cluster), then every fuzz target
## for FUZZTIME (fuzz-ci)
test: deps vet
	$(GO) test -race -count=1 ./...
	@$(MAKE) --no-print-directory test-cluster
	@$(MAKE) --no-print-directory test-shared
	@$(MAKE) --no-print-directory fuzz-ci

## test-cluster: the packages whose tests share one Redis (the buckets, the engine, its
## transports and admin API) run again with that Redis a 3-master cluster: the same table
## tests, on the other topology
CLUSTER_PACKAGES := ./internal/bucket/ ./checker/... ./internal/app/admin/
test-cluster:
	QUOTAFLOW_TEST_REDIS=cluster $(GO) test -race -count=1 $(CLUSTER_PACKAGES)

## test-shared: the bucket package's tests again with every Store in the shared layout
## (--bucket-layout shared), on one Redis and on a cluster, and in the mixed layout: exactness,
## refunds, leases, resharding and failover with the buckets as fields of shared hashes; and in
## the compact layout, whose fixed windows a batch charges by INCRBY
test-shared:
	QUOTAFLOW_TEST_LAYOUT=shared $(GO) test -race -count=1 ./internal/bucket/
	QUOTAFLOW_TEST_LAYOUT=shared QUOTAFLOW_TEST_REDIS=cluster $(GO) test -race -count=1 ./internal/bucket/
	QUOTAFLOW_TEST_LAYOUT=mixed $(GO) test -race -count=1 ./internal/bucket/
	QUOTAFLOW_TEST_LAYOUT=compact QUOTAFLOW_TEST_REDIS=cluster $(GO) test -race -count=1 ./internal/bucket/

## deps: install the servers the project needs (Debian packages) when missing
deps:
	@bash deploy/dev/install-deps.sh

build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/quotaflow

vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...

## generate: regenerate the protobuf code (committed) with buf and the local protoc plugins
generate:
	$(GO) install github.com/bufbuild/buf/cmd/buf@v1.75.0
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
	$(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" buf generate
	@$(MAKE) --no-print-directory generate-ts

## generate-ts: regenerate the TypeScript client's stubs (committed, checker/client/ts/src/gen)
## with buf and protoc-gen-es from npm, as its package-lock.json pins them. Its build and tests
## run in `make test` through go test ./checker/client/ts/ (npm ci, npm run build, node --test).
TSCLIENT := checker/client/ts
generate-ts:
	cd $(TSCLIENT) && npm ci --no-audit --no-fund && npm run generate

## console: reinstall the web console's third-party files (uPlot) from npm, as its
## package-lock.json pins them, into checker/console/static/vendor (committed, embedded by go
## build; a test checks they are current)
CONSOLE := checker/console
console:
	cd $(CONSOLE)/web && npm ci --ignore-scripts --no-audit --no-fund
	cp $(CONSOLE)/web/node_modules/uplot/dist/uPlot.iife.min.js $(CONSOLE)/web/node_modules/uplot/dist/uPlot.min.css $(CONSOLE)/static/vendor/
	cp $(CONSOLE)/web/node_modules/uplot/LICENSE $(CONSOLE)/static/vendor/uPlot.LICENSE

# FUZZ_TARGETS lists every fuzz target once, as package:Target. A target whose run fails
# leaves the failing input in the package's testdata/fuzz/Target/: commit it with the fix, and
# every later `go test` replays it.
FUZZ_TARGETS := \
	./checker/rules:FuzzMatch \
	./checker/rules:FuzzParse \
	./internal/urlpath:FuzzNormalize \
	./checker:FuzzCheckRequest \
	./checker/transport:FuzzCheckRequest \
	./checker:FuzzIdempotencySequence \
	./checker/transport:FuzzConnectJSON \
	./checker/transport:FuzzConnectProto \
	./checker/transport:FuzzRLS \
	./checker/transport:FuzzForwardAuth \
	./checker/transport:FuzzCheckRateLimits \
	./internal/app/admin:FuzzAdminBodies \
	./internal/webhook:FuzzVerify
FUZZTIME ?= 20s
# FUZZMINIMIZETIME bounds how long a worker shrinks each new interesting input before it fuzzes
# on. Go's default, 60s, let one input of about 1 KB stall FuzzParse's two workers from its 3rd
# second to its last in every CI run (20,256 executions); at 2s the same 20s ran 308,071 and
# found 80 new inputs. A failing input is still written, shrunk as far as 2s goes.
FUZZMINIMIZETIME ?= 2s

## fuzz: install what is missing, then run each fuzz target for FUZZTIME (default 20s)
fuzz: deps fuzz-ci

## fuzz-ci: run each fuzz target for FUZZTIME, one after the other (go test fuzzes one target
## at a time); the last step of test. Go before 1.27 may fail a run that found nothing with a
## bare "context deadline exceeded" as FUZZTIME ends (go.dev/issue/75804): such a run, which
## wrote no failing input, is reported and passed over; any other failure fails.
fuzz-ci:
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "$(GO) test -run='^\$$' -fuzz='^$$name\$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg/"; \
	  $(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZETIME) $$pkg/ 2>&1 | tee "$$log"; \
	  [ $${PIPESTATUS[0]} -eq 0 ] && continue; \
	  if grep -qx '    context deadline exceeded' "$$log" && ! grep -q 'Failing input written' "$$log"; then \
	    echo "fuzz-ci: $$name: the run ended with Go's fuzztime race (go.dev/issue/75804), no failing input: passed over"; \
	    continue; \
	  fi; \
	  exit 1; \
	done

## bench: the benchmarks (checks/s, decisions/s, allocations); figures in docs/performance.md
bench: deps
	$(GO) test -run='^$$' -bench=. -benchmem ./checker/ ./checker/transport/ ./checker/client/ ./cmd/quotaflow/ ./publisher/ ./internal/bucket/ ./checker/rules/ ./internal/urlpath/

## bench-ts: checks/s and latency of the TypeScript client from one Node process beside the Go
## client's, against one checker process (figures in checker/client/ts/README.md)
bench-ts: deps
	QUOTAFLOW_TS_BENCH=1 $(GO) test -count=1 -run='^TestBenchmark$$' -v ./$(TSCLIENT)/

clean:
	rm -rf bin .dev
