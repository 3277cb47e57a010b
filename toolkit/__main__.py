from toolkit.cli import main

main()
