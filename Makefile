# yirangmq — build, test, demo, bench, lint. `make test` is what CI runs.
GO      ?= go
BIN     := bin/yirangmq
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
TOOLS   := $(CURDIR)/bin/tools
# A count, not a duration: Go 1.26's fuzz coordinator can fail a target with
# "context deadline exceeded" when a duration -fuzztime runs out while a
# worker is mid-call (golang/go#75804, fixed in Go 1.27). A count has no
# deadline to race. 50000 runs take about 10 s per target here.
FUZZTIME ?= 50000x
export CGO_ENABLED := 1
# A go.work in a parent directory must not change what this module builds.
export GOWORK := off

.PHONY: all deps build test uring-check fuzz demo bench bench-go torture mount-bench mem-bench mem-soak lint install docs clean release release-bin test-cross

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/yirangmq

# Every test, with the race detector and in shuffled order, then each fuzz
# target for a short time (FUZZTIME=50000x runs each; longer by hand).
# The benchmark tooling is a module of its own (bench/go.mod),
# which ./... does not descend into: it is vetted and tested on its own;
# so is the vendored go-fuse (third_party/go-fuse), for the tests of our
# patches to it (PATCHES.md).
# Every daemon of the tests serves through FUSE over io_uring, then the
# suites that promise the mount's behaviour (the filesystem layer with the
# contract test, the kill -9 torture, the memory tests) run again through
# /dev/fuse (testenv.TransportEnv). The kernel must offer io_uring: see
# uring-check.
BENCH_DIR := bench
CLASSIC_AGAIN := ./fusefs ./testenv/torture ./testenv/membound
test: deps build uring-check
	$(GO) vet ./...
	cd $(BENCH_DIR) && $(GO) vet ./...
	YIRANGMQ_TEST_TRANSPORT=uring $(GO) test -race -shuffle=on -timeout 30m ./...
	YIRANGMQ_TEST_TRANSPORT=classic $(GO) test -race -shuffle=on -timeout 30m $(CLASSIC_AGAIN)
	cd $(BENCH_DIR) && $(GO) test -race -shuffle=on -timeout 10m ./...
	cd third_party/go-fuse && GOFUSE_REQUIRE_IOURING=1 $(GO) test -race -run 'Patch|Backing|IoUring' ./fs ./fuse
	$(MAKE) fuzz

# The io_uring half of make test needs a kernel that offers FUSE over
# io_uring (Linux 6.14+ with CONFIG_FUSE_IO_URING; docs/performance.md).
URING_PARAM := /sys/module/fuse/parameters/enable_uring
uring-check:
	@grep -qx Y $(URING_PARAM) 2>/dev/null || { echo "make test: FUSE over io_uring is off ($(URING_PARAM): $$(cat $(URING_PARAM) 2>&1)); as root: echo Y > $(URING_PARAM), or boot with fuse.enable_uring=1 (.ci/run does it)" >&2; exit 1; }

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParsePolicy$$' -fuzztime $(FUZZTIME) ./queuecore
	$(GO) test -run '^$$' -fuzz '^FuzzParseEnvelope$$' -fuzztime $(FUZZTIME) ./queuecore
	$(GO) test -run '^$$' -fuzz '^FuzzCheckBody$$' -fuzztime $(FUZZTIME) ./queuecore
	$(GO) test -run '^$$' -fuzz '^FuzzCheckQueueName$$' -fuzztime $(FUZZTIME) ./queuecore
	$(GO) test -run '^$$' -fuzz '^FuzzCheckMessageName$$' -fuzztime $(FUZZTIME) ./queuecore
	$(GO) test -run '^$$' -fuzz '^FuzzErrnoOf$$' -fuzztime $(FUZZTIME) ./fusefs
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeTxn$$' -fuzztime $(FUZZTIME) ./backends/fs
	$(GO) test -run '^$$' -fuzz '^FuzzParseFields$$' -fuzztime $(FUZZTIME) ./backends/fs

# Release binaries for linux/amd64, linux/arm64 and linux/arm (GOARM=7),
# two per architecture (docs/operations.md): yirangmq-linux-ARCH with every
# store, at most 16 MB, and yirangmq-nopostgres-linux-ARCH without the
# postgres store (-tags nopostgres), at most 9 MB; make release fails when
# one is over its budget. cgo SQLite built by Debian's cross compilers,
# linked statically, stripped, version-stamped, in $(RELEASE_DIR) with
# SHA256SUMS. Needs: apt-get install gcc-aarch64-linux-gnu
# gcc-arm-linux-gnueabihf libc6-dev-arm64-cross libc6-dev-armhf-cross.
# RELEASE_TAGS are added to both variants' tags. The nopostgres variant's C
# (SQLite) is compiled for size (-Os): 0.35 MB less on amd64, which takes
# it under its budget, for some 8% more CPU in SQLite's own work (in
# process; through the mount FUSE's kernel time dominates).
RELEASE_DIR     ?= bin/release
RELEASE_TAGS    ?=
RELEASE_ARCHES  ?= amd64 arm64 armv7
# Budgets in bytes (MB of 10^6 bytes).
BUDGET_full       := 16000000
BUDGET_nopostgres := 9000000
release_tags     = sqlite_omit_load_extension,osusergo,netgo$(if $(RELEASE_TAGS),$(comma)$(RELEASE_TAGS))
comma           := ,
CC_amd64        ?= gcc
CC_arm64        ?= aarch64-linux-gnu-gcc
CC_armv7        ?= arm-linux-gnueabihf-gcc
goenv_amd64      = GOARCH=amd64
goenv_arm64      = GOARCH=arm64
goenv_armv7      = GOARCH=arm GOARM=7
release_bins     = $(foreach a,$(RELEASE_ARCHES),yirangmq-linux-$(a) yirangmq-nopostgres-linux-$(a))

release: $(foreach a,$(RELEASE_ARCHES),release-$(a) release-nopostgres-$(a))
	cd $(RELEASE_DIR) && sha256sum $(release_bins) > SHA256SUMS
	@cd $(RELEASE_DIR) && ls -l $(release_bins) && cat SHA256SUMS
	@cd $(RELEASE_DIR) && over=0; for a in $(RELEASE_ARCHES); do \
		for v in full:yirangmq-linux-$$a:$(BUDGET_full) nopostgres:yirangmq-nopostgres-linux-$$a:$(BUDGET_nopostgres); do \
			f=$${v#*:}; f=$${f%%:*}; max=$${v##*:}; size=$$(stat -c %s $$f); \
			if [ $$size -gt $$max ]; then echo "make release: $$f is $$size bytes, over its budget of $$max" >&2; over=1; \
			else echo "$$f: $$size bytes, budget $$max"; fi; \
		done; \
	done; exit $$over

# One variant for one architecture: release-ARCH (every store) and
# release-nopostgres-ARCH.
release-nopostgres-%:
	$(MAKE) --no-print-directory release-bin ARCH=$* NAME=yirangmq-nopostgres-linux-$* TAGS='$(release_tags),nopostgres' CFLAGS=-Os

release-%:
	$(MAKE) --no-print-directory release-bin ARCH=$* NAME=yirangmq-linux-$* TAGS='$(release_tags)'

release-bin:
	@command -v $(CC_$(ARCH)) >/dev/null || { echo "make release: no $(CC_$(ARCH)) (apt-get install gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf libc6-dev-arm64-cross libc6-dev-armhf-cross)" >&2; exit 1; }
	GOOS=linux $(goenv_$(ARCH)) CC=$(CC_$(ARCH)) $(if $(CFLAGS),CGO_CFLAGS='$(CFLAGS)') $(GO) build -trimpath -tags '$(TAGS)' \
		-ldflags "-s -w -X main.version=$(VERSION) -extldflags -static" \
		-o $(RELEASE_DIR)/$(NAME) ./cmd/yirangmq

# The queue core's and the local stores' tests (conformance suite and crash
# test included), built for arm64 and armv7 and run under qemu-user
# (scripts/test-cross.sh; 5-9 minutes per architecture on a loaded 2-core
# machine, most of it building, so not part of make test). CROSS_ARCHES=arm64
# for one, CROSS_RUN to select tests, CROSS_MOUNT=1 to add the FUSE tests
# against the ARM daemons of make release serving under qemu.
test-cross:
	scripts/test-cross.sh

# What make test needs besides Go (scripts/deps.sh): installed with
# apt-get when run as root on Debian, else one line says what is missing.
# Nothing happens when everything is there.
deps:
	GO=$(GO) scripts/deps.sh

# The main job on the embedded default store (SQLite), under var/demo
# (DEMO_DIR moves it). It checks what it needs first and says what is
# missing in one line.
demo:
	@GO=$(GO) scripts/demo.sh --check
	$(MAKE) --no-print-directory build
	BIN=$(BIN) scripts/demo.sh

# The benchmark suite (docs/bench.md), as root: yirangmq through the mount
# (on both transports when the kernel offers io_uring) and in process
# against a plain directory (with and without fsync), a go-fuse loopback
# mount (and one that syncs at flush), a goqite-style SQLite queue and
# POSIX message queues, in one run, with 1 MiB messages and the latency
# at half of peak; each goal ratio the median of 5 rounds. Prints the
# tables and the goals, each beside its value in the previous
# results/bench-latest.json; then writes
# results/bench-<time>.{json,png} and results/bench-latest.{json,png}.
# The driver is a module of its own (bench/go.mod).
# About 10 minutes; BENCH_QUICK=1 about 3 (more on a loaded machine);
# BENCH_MILLION=1 fills 1,000,000
# ready messages for the scale run (about 45 s more).
BENCH_FLAGS = $(if $(filter 1,$(BENCH_QUICK)),--quick) $(if $(filter 1,$(BENCH_MILLION)),--million)
bench: build
	cd $(BENCH_DIR) && $(GO) run . suite --bin $(CURDIR)/$(BIN) --out-dir $(CURDIR)/results $(BENCH_FLAGS)

# Go benchmarks of the queue core on both stores, against a goqite-style
# baseline, in one run. BENCHTIME=2s for steadier figures.
BENCHTIME ?= 1s
bench-go:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 60m ./queuecore/ ./backends/...

# The kill -9 torture through the mount, per store (sqlite, fs, and two
# daemons on one PostgreSQL database with the duty holder killed), KILLS
# kills each (default 100), or for DURATION each when given; then the
# power-cut run (DURATION, default 5m). Prints each checker's summary:
# kills, stuck daemons, stuck clients, lost, duplicates, restart times.
# make test runs both briefly (20 kills and 20 cuts per store). The kills
# run once per transport (TRANSPORTS; io_uring needs the kernel's
# enable_uring, see uring-check).
KILLS ?= 100
TRANSPORTS ?= uring classic
torture: build
	for tr in $(TRANSPORTS); do echo "== transport $$tr"; YIRANGMQ_TEST_TRANSPORT=$$tr $(GO) test -count=1 -timeout 0 -v -run '^TestKillNineTorture(Shared)?$$' ./testenv/torture -kills $(KILLS) -syncs full $(if $(DURATION),-duration $(DURATION)) 2>&1 | grep -E 'lost|kill phase|stuck|exit after|blocked|still there|^(ok|FAIL|---)'; done
	$(GO) test -count=1 -timeout 0 -v -run '^TestPowerCutFullSync$$' ./testenv/powercut -duration $(or $(DURATION),5m) 2>&1 | grep -E 'power cuts|^(ok|FAIL|---)'

# The daemon in a 64 MiB memory cgroup (as root): 1,000,000 messages
# published through the mount with no consumer, then drained, per local
# store; prints the daemon's RSS at 0, 100k, 500k and 1M (docs/performance.md).
# make test runs it with 20,000. MEM_MESSAGES and MEM_STORES change it.
MEM_MESSAGES ?= 1000000
MEM_STORES   ?= sqlite,fs
mem-bench: build
	YIRANGMQ_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 0 -v -run '^TestBacklogInMemoryCgroup$$' ./testenv/membound -messages $(MEM_MESSAGES) -stores $(MEM_STORES) 2>&1 | grep -E 'RSS|accepted|drained|^(ok|FAIL|---)|Error|error'

# 2 producers and 2 consumers for SOAK (default 5m) with a growing backlog,
# the daemon in a 64 MiB memory cgroup: RSS at the start and the end.
SOAK ?= 5m
SOAK_STORE ?= sqlite
mem-soak: build
	YIRANGMQ_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 0 -v -run '^TestSoakBacklog$$' ./testenv/membound -soak $(SOAK) -stores $(SOAK_STORE) 2>&1 | grep -E 'soak|^(ok|FAIL|---)|Error|error'

# Issue 3's benchmark through a real mount (about 2 minutes, as root).
mount-bench: build
	cd $(BENCH_DIR) && $(GO) run . --bin $(CURDIR)/$(BIN) --out $(CURDIR)/results/mount-bench.json

# docs/cli.md is generated from the flag definitions.
docs: build
	./$(BIN) reference > docs/cli.md

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint: $(TOOLS)/staticcheck
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...
	cd $(BENCH_DIR) && $(GO) vet ./... && $(TOOLS)/staticcheck ./...

# Install the binary, the mount helper link that lets mount(8) and
# /etc/fstab mount fuse.yirangmq, the systemd unit, and the consumer
# units (yirangmq-consumer@QUEUE.path starts a consumer when work arrives).
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(BINDIR)/yirangmq
	install -d $(DESTDIR)$(SBINDIR)
	ln -sf $(BINDIR)/yirangmq $(DESTDIR)$(SBINDIR)/mount.fuse.yirangmq
	install -d $(DESTDIR)$(UNITDIR)
	sed 's|@BINDIR@|$(BINDIR)|g' dist/yirangmq.service > $(DESTDIR)$(UNITDIR)/yirangmq.service
	sed 's|@BINDIR@|$(BINDIR)|g' 'dist/yirangmq-consumer@.service' > '$(DESTDIR)$(UNITDIR)/yirangmq-consumer@.service'
	install -m 0644 'dist/yirangmq-consumer@.path' '$(DESTDIR)$(UNITDIR)/yirangmq-consumer@.path'
	chmod 0644 $(DESTDIR)$(UNITDIR)/yirangmq.service '$(DESTDIR)$(UNITDIR)/yirangmq-consumer@.service'

clean:
	rm -rf bin var
