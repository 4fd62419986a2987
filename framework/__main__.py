from framework.cli import main

raise SystemExit(main())
