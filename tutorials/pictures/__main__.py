from tutorials.pictures.cli import main

main()
