# Two commands set up everything: `make demo` and `make test`. Both bootstrap .venv from nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.weir-installed
DURATION ?= 90

.PHONY: venv system browser test unit lint demo bench clean

$(STAMP): pyproject.toml $(wildcard weir/jvm/*/pom.xml) | system
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# The SPARK_HOME whose local Python workers start from PySpark's bytecode (weir/sparkhome.py), built once
	$(BIN)/python -c 'from weir.sparkhome import worker_home; print("SPARK_HOME for local workers:", worker_home())'
	@# The JVM jars of weir/jvm/*/pom.xml (the Apache Kafka broker, Kafka's tools), resolved by Maven into the cache,
	@# and the class-data archive a local driver JVM starts from (weir/classdata.py)
	$(BIN)/weir jars fetch
	touch $(STAMP)

venv: $(STAMP)

# What weir runs beside Python, from Debian's packages when missing: Java 17 (Spark, the Apache Kafka broker),
# Maven (the jars), and PostgreSQL's server binaries (the tests and the demo start a private server of their own).
system:
	@missing=""; \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -n "$$missing" ]; then \
		echo "installing from Debian:$$missing"; \
		apt-get -q update && apt-get -q install -y -o DPkg::Lock::Timeout=600 --no-install-recommends $$missing; \
	fi

# The dashboard's browser test drives Debian's Chromium through Playwright (never a browser download of its own).
browser:
	test -x /usr/bin/chromium || { apt-get -q update && apt-get -q install -y -o DPkg::Lock::Timeout=600 \
		--no-install-recommends chromium chromium-driver; }

lint: $(STAMP)
	$(BIN)/ruff check weir tests bench examples
	$(BIN)/ruff format --check weir tests bench examples
	$(BIN)/lint-imports
	@# pytest imports test modules by basename: two of one name in tests/ break a whole run's collection
	@dups="$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d)"; \
		if [ -n "$$dups" ]; then echo "test modules sharing a basename: $$dups"; exit 1; fi

test: $(STAMP) browser lint
	@# Two workers: the tests of the one in-process Spark session on one, the rest beside it (tests/conftest.py)
	WEIR_TEST_BROKER=kafka $(BIN)/python -m pytest -q -ra --durations=50 -n 2 --dist loadgroup tests

unit: $(STAMP)
	WEIR_TEST_BROKER=kafka $(BIN)/python -m pytest -q tests/unit

demo: $(STAMP)
	$(BIN)/python -m examples.shop.demo --duration $(DURATION)

bench: $(STAMP)
	$(BIN)/python bench/pipe.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
