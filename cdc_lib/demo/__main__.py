"""``python -m cdc_lib.demo``: the main job on embedded defaults (see ``run``)."""
import sys

from .run import demo_main

sys.exit(demo_main())
