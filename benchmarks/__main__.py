import sys

from baracuda_numba.bench import main

sys.exit(main())
