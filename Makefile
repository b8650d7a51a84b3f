# allot — the whole set-up is `make demo` and `make test` (see README.md).
GO       ?= go
PKGS     ?= ./...
TIMEOUT  ?= 30m
BENCHTIME ?= 2s

.PHONY: all build test test-short bench lint images proto demo clean

all: build

build:
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/...

# Everything, including the tests against real Redis, Redis Cluster and etcd in containers.
# The images are built locally on first use (no registry is needed).
test: images
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(PKGS)

# Unit tests only: no containers.
test-short:
	$(GO) test -short -race -count=1 $(PKGS)

bench: images
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout $(TIMEOUT) $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

images:
	bash scripts/images.sh

demo:
	@echo "make demo: the three-region regionsim demo arrives with milestone 2 (the balancer and regionsim)."
	@echo "It does not exist yet. Until then, see README.md for running one enforcer stack per region."
	@exit 1

clean:
	rm -rf bin
