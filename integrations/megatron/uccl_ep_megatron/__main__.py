"""``python -m uccl_ep_megatron SCRIPT [ARGS...]``: run a Megatron training script with the hook."""

import sys

from .cli import main

sys.exit(main())
