.PHONY: setup run test test-fast
setup:
	bash scripts/setup.sh
run:
	bash scripts/run.sh $(ARGS)
test:
	bash scripts/test.sh
test-fast:
	.venv/bin/python -m pytest -q -m "not slow"
