from glm53ctl.cli import main

main()
