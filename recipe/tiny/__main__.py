"""``python -m recipe.tiny``: build (once) and show the tiny default model."""

from recipe.tiny.arithmetic import main

if __name__ == "__main__":
    main()
