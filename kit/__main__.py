from kit.cli import main

if __name__ == "__main__":  # `python -m kit`; not when imported
    main()
