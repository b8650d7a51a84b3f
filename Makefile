# allot — the whole set-up is `make demo` and `make test` (see README.md).
GO       ?= go
PKGS     ?= ./...
TIMEOUT  ?= 30m
BENCHTIME ?= 2s

.PHONY: all build test test-short bench lint images proto demo clean tools release release-check image

all: build

# The binaries in bin/, stamped like a release (`bin/enforcer -version`: the version from
# git describe, else dev, and the commit; scripts/release.sh ldflags).
build:
	$(GO) build ./...
	$(GO) build -ldflags "$$(bash scripts/release.sh ldflags)" -o bin/ ./cmd/...

# Everything, including the tests against real Redis, Redis Cluster and etcd in containers.
# The images are built locally on first use (no registry is needed).
# One package at a time (-p 1): the drills and the outage tests judge latencies and
# breaker behaviour on a real stack, and a second package's race-instrumented CPU load on
# these 2-core machines would be measured as theirs.
test: images
	$(GO) test -race -count=1 -p 1 -timeout $(TIMEOUT) $(PKGS)

# The external tools tests exec (promtool, from Debian's prometheus package; chromium for the
# dashboard's browser test), installed when missing, and helm, built from the Go module proxy
# into bin/tools (a few minutes the first time). `make test` needs no separate step:
# configs/prometheus_test.go, pkg/balancer/dashboard/browser_test.go and deploy/helm's tests
# call the scripts.
tools:
	bash scripts/tools.sh promtool
	bash scripts/tools.sh chromium
	bash scripts/helm.sh

# Unit tests only: no containers.
test-short:
	$(GO) test -short -race -count=1 $(PKGS)

bench: images
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout $(TIMEOUT) $(PKGS)

# The 10,000-key population (issue 26): a scale run of a few minutes in virtual mode, not
# part of `make test`. Prints the distribution of each figure over the keys and the worst
# keys; exits 1 while any key fails (BENCHMARKS.md has the latest figures).
.PHONY: long-tail
long-tail:
	$(GO) build -o bin/regionsim ./cmd/regionsim
	bash -c 'time bin/regionsim run -scenario configs/scenarios/long-tail.yaml -summary bin/long-tail.json'

# The same population with the bursts `balancer shares` advises (regionsim population
# -burst advised): what raising a small key's burst does for the keys long-tail fails.
# Exits 1 while any key fails, as long-tail does (19 first phases recover in over 15 s).
.PHONY: long-tail-advised
long-tail-advised:
	$(GO) build -o bin/regionsim ./cmd/regionsim
	bin/regionsim population -burst advised > bin/long-tail-advised.yaml
	bash -c 'time bin/regionsim run -scenario bin/long-tail-advised.yaml -summary bin/long-tail-advised.json'

# The same advised population with its middle and tail keys arriving over the first minute
# (regionsim population -arrive 60s): keys new to a balancer that has run a while, the
# case a key's first minutes in a region meet in production. Exits 1 while any key fails.
.PHONY: long-tail-arriving
long-tail-arriving:
	$(GO) build -o bin/regionsim ./cmd/regionsim
	bin/regionsim population -arrive 60s -burst advised > bin/long-tail-arriving.yaml
	bash -c 'time bin/regionsim run -scenario bin/long-tail-arriving.yaml -summary bin/long-tail-arriving.json'

# The enforcer load benchmark (issues 4, 8): one enforcer process vs a 3-master Redis Cluster
# over Envoy RLS gRPC, side by side with a null RLS server in the same run. Prints one table,
# writes it as JSON to bin/bench-load.json, fails on any fallback answer. Not part of `make
# test` (it is a benchmark). See BENCHMARKS.md and e2e/load_test.go (the ALLOT_BENCH_* knobs).
.PHONY: bench-load
bench-load: images
	ALLOT_BENCH_JSON=$(CURDIR)/bin/bench-load.json \
	$(GO) test -run '^$$' -bench BenchmarkEnforcerRLS -benchtime 1x -timeout 15m ./e2e/

# One balancer leader at the design's fan-in (issue 26 §2): a bin/balancer process on etcd
# in a container, driven over gRPC by up to 1,000 simulated enforcers (real usage Reporters),
# in steps that stop where report p99 passes 1 s or a report fails. Prints one table, writes
# it as JSON to bin/bench-scale.json; 4–6 minutes on 2 cores (at most about 11, where more
# steps hold). Not part of `make test` (a benchmark). See BENCHMARKS.md and
# e2e/scale_test.go (the ALLOT_SCALE_* knobs).
.PHONY: bench-scale
bench-scale: images
	ALLOT_SCALE_JSON=$(CURDIR)/bin/bench-scale.json \
	$(GO) test -run '^$$' -bench BenchmarkBalancerScale -benchtime 1x -timeout 20m ./e2e/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# A versioned release (issue 24 §1): static linux/amd64 and linux/arm64 archives of the
# three binaries, NOTES.md (CHANGELOG.md's section for the version) and SHA256SUMS, in
# bin/release/<version>/; the version is git describe's (a tag), else dev. Reproducible:
# the same commit and Go give the same bytes (scripts/release.sh says how).
# ALLOT_RELEASE_ARCHES=amd64 builds one arch.
release:
	bash scripts/release.sh archives

# The reproducibility test with nothing shared: the release for linux/amd64 built twice,
# the second time with an empty Go build cache (a few minutes). `make test` runs the same
# test with the cache shared (TestReleaseReproducible).
release-check:
	ALLOT_RELEASE_COLD_CACHE=1 $(GO) test -count=1 -run '^TestReleaseReproducible$$' -v -timeout 30m ./e2e/

# The image (issue 24 §2): allot/allot:<version>, the release's static binaries for this
# machine's arch on the local base image, running as uid 10001, with OCI labels and a
# HEALTHCHECK (`enforcer probe`). Built locally like every image here; the tag is the
# last line printed. e2e/image_test.go runs it.
image:
	bash scripts/images.sh allot

# The local base image (redis-server, etcd) the tests run; built once per machine. The e2e
# stack's images (allot/gateway: the base plus Debian's nginx and caddy; allot/stack:<hash>: plus
# allot's static binaries) are built by the harness on first use: scripts/images.sh stack.
# With ALLOT_UPSTREAM_IMAGES=1, pkg/testenv uses upstream images instead (see its doc).
images:
	@case "$${ALLOT_UPSTREAM_IMAGES:-}" in \
	  1|t|T|true|TRUE|True) echo "images: ALLOT_UPSTREAM_IMAGES is set; pkg/testenv uses upstream images" ;; \
	  *) bash scripts/images.sh ;; \
	esac

# Remove every test container (named allot-test-* or labelled allot-test), e.g. after a
# killed test run. It also removes those of test runs still in progress.
.PHONY: clean-containers
clean-containers:
	@ids=$$( { docker ps -aq --filter label=allot-test; docker ps -aq --filter name=allot-test-; } | sort -u ); \
	if [ -n "$$ids" ]; then docker rm -f $$ids >/dev/null && echo "clean-containers: removed $$(echo $$ids | wc -w)"; \
	else echo "clean-containers: none"; fi

# The failure drills alone (docs/drills.md): the three-region stack in containers, the drill
# tests (TestDrills; TestBalancerDrills with the balancer replicas; TestAggregatedDrills with
# report aggregators; TestEnforcerCutDrill, one enforcer cut off alone), about 12 minutes on
# 2 cores. `make test` runs them too.
.PHONY: drills stack-up stack-down
drills: images
	$(GO) test -race -count=1 -run '^(TestDrills|TestBalancerDrills|TestAggregatedDrills|TestEnforcerCutDrill)$$' -v -timeout 20m ./e2e/

# The same three-region stack for a user on this machine (everything on 127.0.0.1): prints
# every address and how to point a gateway or regionsim at it, writes them to bin/stack.env,
# and runs until Ctrl-C. `make stack-down` removes a stack whose stack-up was killed.
stack-up: images
	$(GO) run ./e2e/stackup

# Stops a running stack-up (which removes its own containers), then removes any container
# a killed stack-up left, and bin/stack.pid and bin/stack.env. It says which it did.
stack-down:
	@pid=$$(cat bin/stack.pid 2>/dev/null); stopped=; \
	if [ -n "$$pid" ] && kill -0 "$$pid" 2>/dev/null; then kill "$$pid"; \
	  for i in $$(seq 1 300); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done; \
	  if kill -0 "$$pid" 2>/dev/null; then echo "stack-down: stack-up (pid $$pid) still running after 30 s; removing its containers"; \
	  else stopped=1; echo "stack-down: stopped stack-up (pid $$pid); it removed its containers"; fi; fi; \
	rm -f bin/stack.pid bin/stack.env; \
	ids=$$(docker ps -aq --filter label=allot-test.test=stack-up); \
	if [ -n "$$ids" ]; then docker rm -f $$ids >/dev/null 2>&1 || true; echo "stack-down: removed $$(echo $$ids | wc -w) containers left behind"; \
	elif [ -z "$$stopped" ]; then echo "stack-down: no stack was running"; fi

# The demo: three regions of allot in one process (embedded etcd, a balancer, two
# enforcers per region on in-memory stores, real gRPC on loopback), replaying
# configs/scenarios/demo.yaml in real time (about 2 minutes); it prints the balancer's
# dashboard address, ends with the summary table, writes the CSV and plots to bin/demo/,
# and leaves nothing running. Needs nothing but Go.
demo:
	$(GO) build -o bin/regionsim ./cmd/regionsim
	bin/regionsim demo -out bin/demo

# The same demo against three real Redis Clusters (one per region, in local containers,
# started and removed by scripts/region.sh; needs Docker).
.PHONY: demo-redis demo-region
demo-redis: images
	$(GO) build -o bin/regionsim ./cmd/regionsim
	bash scripts/demo-redis.sh

# Milestone 1's one-region walk-through: etcd, a Redis Cluster, two enforcer processes, a
# live rule change and a Redis master outage (needs Docker).
demo-region:
	bash scripts/demo.sh

clean:
	rm -rf bin

# Regenerate proto/ (generated code is committed). Installs its own tools: protoc from Debian
# when missing, protoc-gen-go and protoc-gen-go-grpc at pinned versions into bin/tools.
PROTOC_GEN_GO_VERSION      ?= v1.36.12
PROTOC_GEN_GO_GRPC_VERSION ?= v1.6.2
TOOLS := $(CURDIR)/bin/tools

proto:
	@command -v protoc >/dev/null || (apt-get update && apt-get install -y protobuf-compiler)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	PATH=$(TOOLS):$$PATH protoc -I proto \
		--go_out=proto --go_opt=paths=source_relative \
		--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		$$(find proto -name '*.proto')
