# fastensor - plain GNU make.
#   make            library (build/libfastensor.{so,a}) and CLI (build/fastensor)
#   make test       dependencies checked, C tests, Python tests; SAN=address,undefined or
#                   SAN=thread builds a sanitizer variant under build/san-*/
#   make demo       the demo of `fastensor demo`
#   make install    PREFIX=/usr/local DESTDIR=

SHELL := /bin/bash
VERSION := 0.1.0
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
SAN ?=

ifeq ($(SAN),)
BUILD ?= build
SANFLAGS :=
else
BUILD ?= build/san-$(subst $(comma),-,$(SAN))
SANFLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -g
endif
comma := ,

CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wno-missing-field-initializers
# What is built here loads on glibc 2.28 and newer (src/base/glibc-compat.h); sanitizer
# builds keep the default versions their run-time libraries intercept.
COMPAT := $(if $(SAN),,-include src/base/glibc-compat.h)
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -pthread $(WARN) $(CFLAGS) $(SANFLAGS) $(COMPAT) -Iinclude
# liburing and libxxhash are linked in statically so the library and the CLI run where they
# are not installed; JSON is the library's own (src/base/json.c).
URING_LIBS := -Wl,-Bstatic -luring -lxxhash -Wl,-Bdynamic
# libpthread.so.0 and libdl.so.2 by name: where glibc is older than 2.34 they hold the
# functions glibc-compat.h binds to (newer ones keep them as empty compatibility libraries).
OLD_GLIBC_LIBS := -Wl,--push-state,--no-as-needed -l:libpthread.so.0 -l:libdl.so.2 -Wl,--pop-state
LIBS := $(URING_LIBS) -ldl -lpthread $(OLD_GLIBC_LIBS) -lm

LIB_SRC := $(wildcard src/base/*.c src/core/*.c src/engine/*.c src/ckpt/*.c src/select/*.c src/gpu/*.c src/store/*.c src/codec/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/src/codec/fatbin.o
# The codec's GPU decoder, built where nvcc exists (SASS for sm_80 and sm_90, PTX for newer
# GPUs), embedded in the library; without nvcc it is empty and GPU decodes say so.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
NVCC_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_80,code=compute_80
CLI_SRC := $(wildcard tools/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_LIB := $(BUILD)/tests/testlib.o $(BUILD)/tests/testfault.o
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all lib cli tests test demo deps venv install clean bench bench-offload bench-scenarios python \
	check-faults fuzz fuzz-run
all: lib cli

lib: $(BUILD)/libfastensor.so $(BUILD)/libfastensor.a
cli: $(BUILD)/fastensor

# Each object depends on the headers it includes (-MMD -MP: build/…/x.d, read below).
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC $<"; $(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/src/codec/kernel.fatbin: src/codec/kernel.cu src/codec/dev.h src/codec/enc_dev.h \
    src/codec/enc_xxh3.h
	@mkdir -p $(dir $@)
	@if [ -n "$(NVCC)" ]; then echo "  NVCC $<"; $(NVCC) -fatbin $(NVCC_ARCH) -O3 -o $@ $<; \
	else echo "  (no nvcc: no GPU decoder)"; : > $@; fi

$(BUILD)/src/codec/fatbin.o: src/codec/fatbin.S $(BUILD)/src/codec/kernel.fatbin
	@echo "  AS $<"; $(CC) -c -DFATBIN='"$(BUILD)/src/codec/kernel.fatbin"' $< -o $@

-include $(wildcard $(BUILD)/src/*/*.d $(BUILD)/tools/*.d $(BUILD)/tests/*.d)

$(BUILD)/libfastensor.so: $(LIB_OBJ) src/fastensor.map
	$(CC) -shared -pthread $(SANFLAGS) -Wl,--version-script=src/fastensor.map \
	    -Wl,-soname,libfastensor.so.0 -o $@ $(LIB_OBJ) $(LIBS)

$(BUILD)/libfastensor.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $(LIB_OBJ)

# The CLI uses only the public header; it links the static library (and liburing inside).
# (tools/start.c: the CLI's call into glibc's startup goes to the version of glibc 2.28)
CLI_START := -Wl,--wrap=__libc_start_main
$(BUILD)/fastensor: $(CLI_OBJ) $(BUILD)/libfastensor.a
	$(CC) -pthread $(SANFLAGS) $(CLI_START) -o $@ $(CLI_OBJ) $(BUILD)/libfastensor.a $(LIBS) -lm

# Tests link the static library so they can reach the internal syscall table.
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_LIB) $(BUILD)/libfastensor.a
	$(CC) -pthread $(SANFLAGS) -rdynamic -o $@ $< $(TEST_LIB) $(BUILD)/libfastensor.a $(LIBS) -lm

# The fuzz targets' corpora replayed (no libFuzzer needed): tests/check-fuzz-corpus.sh.
FUZZ_TARGETS := header index profile codec encode
REPLAY_BIN := $(FUZZ_TARGETS:%=$(BUILD)/fuzz-replay/fuzz_%)
$(BUILD)/fuzz-replay/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(BUILD)/libfastensor.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< tests/fuzz/replay.c $(BUILD)/libfastensor.a $(LIBS) -lm

tests: $(TEST_BIN) $(REPLAY_BIN)

# libFuzzer builds (clang): the library instrumented for coverage, ASan and UBSan.
FUZZ_SAN := fuzzer-no-link,address,undefined
FUZZ_BUILD := build/fuzz
FUZZ_SECONDS ?= 60
fuzz:
	$(MAKE) --no-print-directory lib CC=clang SAN=$(FUZZ_SAN) BUILD=$(FUZZ_BUILD)
	@for t in $(FUZZ_TARGETS); do \
	    echo "  FUZZ $$t"; \
	    clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined \
	        -fno-sanitize-recover=undefined -Iinclude tests/fuzz/fuzz_$$t.c \
	        $(FUZZ_BUILD)/libfastensor.a $(LIBS) -lm -o $(FUZZ_BUILD)/fuzz_$$t || exit 1; \
	done

# Each target for FUZZ_SECONDS from its corpus; new inputs go to build/fuzz/corpus-T.
fuzz-run: fuzz
	@for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus-$$t; \
	    echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
	    FASTENSOR_PROFILE=off $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) \
	        -print_final_stats=1 -max_len=65536 $(FUZZ_BUILD)/corpus-$$t \
	        tests/fuzz/corpus/$$t 2>&1 | grep -E "^#[0-9]+.*DONE|stat::number_of_executed|stat::peak|cov:|ERROR|SUMMARY" | tail -4; \
	    test $${PIPESTATUS[0]} -eq 0 || exit 1; \
	done

deps:
	@scripts/deps.sh

# The project's Python environment: Debian's interpreter, the pinned packages of
# requirements-dev.txt (a CPU build of torch). Remade when the pins change.
VENV := .venv
PYTHON ?= $(VENV)/bin/python
$(VENV)/.stamp: requirements-dev.txt
	@# (a venv left without pip by an interrupted run is made again)
	@$(VENV)/bin/python -m pip --version >/dev/null 2>&1 || \
		{ rm -rf $(VENV) && /usr/bin/python3 -m venv $(VENV); }
	$(VENV)/bin/python -m pip install -q -r requirements-dev.txt
	@touch $@
venv: $(VENV)/.stamp

test: deps venv
	$(MAKE) --no-print-directory all tests
	@BUILD=$(BUILD) SAN="$(SAN)" FT_PYTHON=$(abspath $(PYTHON)) tests/run.sh

# The fault and crash runs of every C test program (each reaches its own syscall sites: the
# sweep, the kill trials, the engines, AUTO, the store...), then the check that every call
# site of the syscall table had a fault injected. Sampled past each operation's 24th call as
# `make test` is; FULL=1 fails every call of every entry in turn and runs 250 kill trials.
FULL ?=
check-faults: all tests
	@echo "== fault sweep ($(if $(FULL),full: every call failed in turn,sampled; FULL=1 for every call))"
	@rc=0; FT_NO_PYTEST=1 BUILD=$(BUILD) SAN="$(SAN)" $(if $(FULL),FT_SWEEP_FULL=1 FT_KILL_TRIALS=250) \
	    FT_TEST_DIR=$(abspath $(BUILD)/test-tmp) tests/run.sh || rc=$$?; \
	echo "== fault sweep: $$(tail -1 $(BUILD)/test-tmp/test_sweep.log)"; \
	grep -h -E "syscall-table call sites|^SKIP" $(BUILD)/test-tmp/check-fault-sites.sh.log | \
	    sed 's/^/== /'; exit $$rc

demo: deps venv
	$(MAKE) --no-print-directory all
	$(BUILD)/fastensor demo

# The Python extension, built in place (python/fastensor/_C.abi3.so) for $(PYTHON), and the
# package byte-compiled as an installed one is (with PYTHONDONTWRITEBYTECODE set, every
# process would compile the sources on import).
python: lib cli venv
	FT_REMAKE=0 $(PYTHON) setup.py -q build_ext --inplace --force
	$(PYTHON) -m compileall -q python/fastensor

bench: all python
	bench/vs-fio.sh
	PYTHONPATH=python $(PYTHON) bench/compare.py

bench-offload: all python
	PYTHONPATH=python $(PYTHON) bench/offload.py

# the workflow benchmark: SCEN_ARGS="--size 3G --device cuda --dir /nvme --plot s.png"
bench-scenarios: deps venv all python
	PYTHONPATH=python $(PYTHON) bench/scenarios.py --json scenarios.json $(SCEN_ARGS)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/fastensor.h $(DESTDIR)$(PREFIX)/include/
	install -m 755 $(BUILD)/libfastensor.so $(DESTDIR)$(PREFIX)/lib/libfastensor.so.$(VERSION)
	ln -sf libfastensor.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/libfastensor.so.0
	ln -sf libfastensor.so.0 $(DESTDIR)$(PREFIX)/lib/libfastensor.so
	install -m 644 $(BUILD)/libfastensor.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(BUILD)/fastensor $(DESTDIR)$(PREFIX)/bin/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' src/fastensor.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/fastensor.pc

clean:
	rm -rf build

# The venv is kept by clean; distclean removes it too.
distclean: clean
	rm -rf $(VENV)
