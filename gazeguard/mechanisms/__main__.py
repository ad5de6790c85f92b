"""``python -m gazeguard.mechanisms {show,model,estimate}``: inspect or regenerate the prior that
``k="auto"`` uses (see :mod:`gazeguard.mechanisms.prior`)."""

import sys

from gazeguard.mechanisms.prior import main

sys.exit(main(prog="python -m gazeguard.mechanisms"))
