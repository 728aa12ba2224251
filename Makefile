# fastensor - plain GNU make.
#   make            library (build/libfastensor.{so,a}) and CLI (build/fastensor)
#   make test       dependencies checked, C tests, Python tests; SAN=address,undefined or
#                   SAN=thread builds a sanitizer variant under build/san-*/
#   make demo       the demo of `fastensor demo`
#   make install    PREFIX=/usr/local DESTDIR=

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
ALL_CFLAGS := -std=c11 -D_GNU_SOURCE -fPIC -pthread $(WARN) $(CFLAGS) $(SANFLAGS) -Iinclude
# liburing is linked in statically so the library runs where liburing is not installed.
URING_LIBS := -Wl,-Bstatic -luring -Wl,-Bdynamic
LIBS := $(URING_LIBS) -ljansson -lxxhash -ldl -lpthread

LIB_SRC := $(wildcard src/core/*.c src/engine/*.c src/ckpt/*.c src/select/*.c src/gpu/*.c src/store/*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_SRC := $(wildcard tools/*.c)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_LIB := $(BUILD)/tests/testlib.o $(BUILD)/tests/testfault.o
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all lib cli tests test demo deps venv install clean bench bench-offload python \
	check-faults fuzz fuzz-run
all: lib cli

lib: $(BUILD)/libfastensor.so $(BUILD)/libfastensor.a
cli: $(BUILD)/fastensor

$(BUILD)/%.o: %.c $(wildcard include/*.h src/*/*.h tools/*.h tests/*.h)
	@mkdir -p $(dir $@)
	@echo "  CC $<"; $(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/libfastensor.so: $(LIB_OBJ) src/fastensor.map
	$(CC) -shared -pthread $(SANFLAGS) -Wl,--version-script=src/fastensor.map \
	    -Wl,-soname,libfastensor.so.0 -o $@ $(LIB_OBJ) $(LIBS)

$(BUILD)/libfastensor.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $(LIB_OBJ)

# The CLI uses only the public header; it links the static library (and liburing inside).
$(BUILD)/fastensor: $(CLI_OBJ) $(BUILD)/libfastensor.a
	$(CC) -pthread $(SANFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libfastensor.a $(LIBS) -lm

# Tests link the static library so they can reach the internal syscall table.
$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_LIB) $(BUILD)/libfastensor.a
	$(CC) -pthread $(SANFLAGS) -rdynamic -o $@ $< $(TEST_LIB) $(BUILD)/libfastensor.a $(LIBS) -lm

tests: $(TEST_BIN)

deps:
	@scripts/deps.sh

# The project's Python environment: Debian's interpreter, the pinned packages of
# requirements-dev.txt (a CPU build of torch). Remade when the pins change.
VENV := .venv
PYTHON ?= $(VENV)/bin/python
$(VENV)/.stamp: requirements-dev.txt
	@test -x $(VENV)/bin/python || /usr/bin/python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q -r requirements-dev.txt
	@touch $@
venv: $(VENV)/.stamp

test: deps venv
	$(MAKE) --no-print-directory all tests
	@BUILD=$(BUILD) SAN="$(SAN)" FT_PYTHON=$(abspath $(PYTHON)) tests/run.sh

# The long fault and crash runs: every call of every syscall-table entry failed in turn for
# each operation, 250 kill trials, and the site coverage check over both.
check-faults: all tests
	@mkdir -p $(BUILD)/test-tmp
	rm -f $(BUILD)/test-tmp/fault-sites.txt
	FT_SWEEP_FULL=1 FT_TEST_DIR=$(abspath $(BUILD)/test-tmp) \
	    FT_FAULT_SITES=$(abspath $(BUILD)/test-tmp/fault-sites.txt) $(BUILD)/tests/test_sweep
	FT_KILL_TRIALS=250 FT_TEST_DIR=$(abspath $(BUILD)/test-tmp) \
	    FT_FAULT_SITES=$(abspath $(BUILD)/test-tmp/fault-sites.txt) $(BUILD)/tests/test_commit
	FT_FAULT_SITES=$(abspath $(BUILD)/test-tmp/fault-sites.txt) tests/check-fault-sites.sh

demo: deps venv
	$(MAKE) --no-print-directory all
	$(BUILD)/fastensor demo

# The Python extension, built in place (python/fastensor/_C.abi3.so) for $(PYTHON).
python: lib venv
	FT_REMAKE=0 $(PYTHON) setup.py -q build_ext --inplace --force

bench: all python
	bench/vs-fio.sh
	PYTHONPATH=python $(PYTHON) bench/compare.py

bench-offload: all python
	PYTHONPATH=python $(PYTHON) bench/offload.py

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
