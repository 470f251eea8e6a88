from anatomy.cli import main

if __name__ == "__main__":  # spawned children re-import this module: they must not run main
    raise SystemExit(main())
