# quotaflow — `make dev` runs the pipeline on 127.0.0.1:8080, `make test` runs every test.
SHELL := /bin/bash
GO    ?= go
BIN   := bin/quotaflow

.PHONY: dev test deps build generate vet fuzz bench clean

## dev: install what is missing, start Redis and the checker, stop all on Ctrl-C
dev: deps build
	@bash deploy/dev/run.sh

## test: install what is missing, then vet and run the whole suite against real servers
test: deps vet
	$(GO) test -race -count=1 ./...

## deps: install the servers the project needs (Debian packages) when missing
deps:
	@bash deploy/dev/install-deps.sh

build:
	$(GO) build -o $(BIN) ./cmd/quotaflow

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

## fuzz: run each fuzz target for FUZZTIME (default 30s)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzMatch$$' -fuzztime=$(FUZZTIME) ./internal/rules/
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./internal/rules/
	$(GO) test -run='^$$' -fuzz='^FuzzCheckRequest$$' -fuzztime=$(FUZZTIME) ./checker/

## bench: the benchmarks (checks/s, decisions/s, allocations); figures in docs/performance.md
bench: deps
	$(GO) test -run='^$$' -bench=. -benchmem ./checker/ ./checker/transport/ ./cmd/quotaflow/ ./publisher/ ./internal/bucket/ ./internal/rules/

clean:
	rm -rf bin .dev
