from kit.cli import main

if __name__ == "__main__":  # not when multiprocessing imports it
    main()
