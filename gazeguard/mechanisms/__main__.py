"""``python -m gazeguard.mechanisms {show,model,estimate}``: inspect or regenerate the prior that
``k="auto"`` uses (see :mod:`gazeguard.mechanisms.prior`; the command line is
:mod:`gazeguard.cli.mechanisms`)."""

import sys

from gazeguard.cli.mechanisms import main

sys.exit(main(prog="python -m gazeguard.mechanisms"))
