from fedmpi.cli import main

raise SystemExit(main())
