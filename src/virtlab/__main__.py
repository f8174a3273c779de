from virtlab.cli import main

main()
