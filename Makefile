# pgflow-upgrade — `make` lists the targets.
GO       ?= go
PKGS     ?= ./...
# The longest test packages start first, so the two lanes of a 2-core
# machine end together instead of one long package running alone at the end.
TEST_FIRST ?= $(if $(filter ./...,$(PKGS)),./internal/cli ./upgrade_tests ./internal/capture)
FUZZTIME ?= 20s

# go-test-tallied FLAGS: go test with FLAGS over the packages, then the tally
# of what the test binaries ran on (each binary that used a database writes
# one line; go test shows a passing binary's own output only with -v).
define go-test-tallied
	@log=$$(mktemp); \
	PGFLOW_UPGRADE_COMPONENTS_LOG=$$log $(GO) test $(1) $(TEST_FIRST) $(PKGS); rc=$$?; \
	echo "what the test binaries ran on (count, pgmq; pg_cron):"; sort $$log | uniq -c; rm -f $$log; exit $$rc
endef

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-zA-Z_-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: setup
setup: ## install what a fresh machine lacks (PostgreSQL 15, PgBouncer, a cluster user)
	@bash scripts/setup.sh

.PHONY: build
build: ## build bin/pgflow-upgrade
	$(GO) build -o bin/pgflow-upgrade ./cmd/pgflow-upgrade

# go vet runs first with every analyzer (its results are cached); go test's
# own vet pass, a subset of the same analyzers run again per package, is off.
.PHONY: test
test: setup ## run the whole suite with -race (ephemeral local cluster, or PGFLOW_UPGRADE_TEST_DSN)
	$(GO) vet $(PKGS)
	$(call go-test-tallied,-vet=off -race -count=1 -timeout 40m)

.PHONY: test-short
test-short: setup ## the inner loop: go vet, then go test -short (long tests and most seeds skipped, each saying so)
	$(GO) vet $(PKGS)
	$(call go-test-tallied,-vet=off -short -count=1 -timeout 10m)

.PHONY: test-long
test-long: export PGFLOW_UPGRADE_LONG=1
test-long: setup ## the long tests (TestLong...: every upstream release, fleets, faults), outside make test's 7-minute clock
	$(call go-test-tallied,-vet=off -count=1 -timeout 80m -run '^TestLong')

.PHONY: fuzz
fuzz: setup ## run every Fuzz* target for $(FUZZTIME) each (their seed corpora run in `make test`)
	@failed=""; for t in $$(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | sed 's/:func /:/' | sort -u); do \
		file=$${t%%:*}; fn=$${t##*:}; pkg=./$$(dirname "$${file#./}"); \
		echo "== $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) "$$pkg" || failed="$$failed $$fn"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz targets that failed:$$failed (the failing input is under testdata/fuzz/)"; exit 1; fi

.PHONY: lint
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint: tidy-check ## gofmt check, go vet, staticcheck (pinned, fetched by go run) and go.mod/go.sum tidy
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) run $(STATICCHECK) -tags docker ./internal/pgprovider/

.PHONY: tidy-check
tidy-check: ## fail when `go mod tidy` would change go.mod or go.sum (prints the diff)
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy and commit the result"; exit 1; }

.PHONY: demo
demo: setup ## the main job on the embedded default: replay every upgrade scenario on an ephemeral cluster
	$(GO) run ./cmd/pgflow-upgrade fixtures replay

.PHONY: bench
BENCH_SIZES ?= 1000000,5000000
BENCH_REPEAT ?= 3
bench: setup ## run the benchmarks (see BENCHMARKS.md); BENCH_SIZES, BENCH_REPEAT, PGFLOW_UPGRADE_BENCH_DSN
	$(GO) run ./bench/cmd/pgflow-bench -sizes $(BENCH_SIZES) -repeat $(BENCH_REPEAT)

.PHONY: atlas-sum
atlas-sum: ## recompute migrations/atlas.sum (only after the migration was reviewed)
	$(GO) run ./internal/tools/atlassum migrations
