# The two commands of README.md: `make demo` and `make test`. Both set up .venv first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.trainmate-setup

.PHONY: demo test lint typecheck labextension pytest bench docs clean

$(STAMP): pyproject.toml labextension/package.json labextension/package-lock.json scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	@touch $@

demo: $(STAMP)
	$(BIN)/trainmate doctor || echo "(doctor reported failures; the demo goes on)"
	$(BIN)/python scripts/demo.py

test: lint typecheck labextension pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# tsc (strict) and the rspack bundle, into jupyter_trainmate/labextension/ (linked into the venv).
labextension: $(STAMP)
	npm --prefix labextension run build:prod

pytest: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# The API docs of jupyter_trainmate (the package docstring is the user guide), with pdoc.
docs: $(STAMP)
	$(BIN)/pdoc jupyter_trainmate jupyter_trainmate.refactor -o build/docs

clean:
	rm -rf $(VENV) build dist labextension/node_modules labextension/lib jupyter_trainmate/labextension
