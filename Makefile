# The two commands of README.md: `make demo` and `make test`. Both set up .venv first.
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.trainmate-setup

.PHONY: demo test lint typecheck labextension pytest bench docs lab screenshots clean

$(STAMP): pyproject.toml labextension/package.json labextension/package-lock.json scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	@touch $@

demo: $(STAMP)
	$(BIN)/trainmate doctor || echo "(doctor reported failures; the demo goes on)"
	$(BIN)/python scripts/demo.py

# JupyterLab from .venv on the bundled notebooks: the sidebar and the widget in a browser.
lab: $(STAMP)
	$(BIN)/python scripts/lab.py

# The README's pictures, taken by the browser tests.
screenshots: $(STAMP)
	TRAINMATE_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/python -m pytest -m browser -q tests/test_browser.py

test: lint typecheck labextension pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# tsc (strict) and the rspack bundle, into jupyter_trainmate/labextension/ (linked into the venv).
labextension: $(STAMP)
	npm --prefix labextension run build:prod

# Two workers (the 2-core machines this runs on), a whole test file to each (`loadfile`): a
# module's fixtures (a package refactored, a notebook executed, a wheel built) are made once.
# Files are handed out in collection order, which tests/conftest.py starts with the longest
# (`--no-loadscope-reorder`: xdist would order them by their number of tests).
pytest: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# The API docs of jupyter_trainmate (the package docstring is the user guide), with pdoc.
docs: $(STAMP)
	$(BIN)/python scripts/docs.py build/docs

clean:
	rm -rf $(VENV) build dist labextension/node_modules labextension/lib jupyter_trainmate/labextension
