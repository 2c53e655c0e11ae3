"""Entry point of ``python -m recipe`` (see recipe/main.py)."""

from recipe.main import cli

if __name__ == "__main__":
    cli()
