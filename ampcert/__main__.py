from ampcert.cli import main

main()
