from dcptool.cli.app import main

main()
