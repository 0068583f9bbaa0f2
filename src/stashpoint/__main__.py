from stashpoint.cli import main

main()
