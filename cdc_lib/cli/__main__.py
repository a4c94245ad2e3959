"""``python -m cdc_lib.cli``: the ``cassandra-cdc`` command."""
import sys

from .main import main

sys.exit(main())
