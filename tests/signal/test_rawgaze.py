"""The GGR1 raw gaze block codec (the wire format of the fleet's JetStream stream)."""

from __future__ import annotations

import numpy as np
import pytest

from gazeguard.core.errors import StreamError
from gazeguard.core.samples import GazeSamples
from gazeguard.signal.rawgaze import decode_gaze, encode_gaze


def test_raw_block_codec_round_trip_and_rejects_garbage() -> None:
    block = GazeSamples.from_arrays([0.0, 0.01, 0.02], [1.0, np.nan, 3.0], [0.5, 0.5, 0.5])
    back = decode_gaze(encode_gaze(block))
    np.testing.assert_array_equal(back.timestamps, block.timestamps)
    np.testing.assert_array_equal(back.valid, [True, False, True])
    with pytest.raises(StreamError, match="expected b'GGR1'"):
        decode_gaze(b"XXXX" + encode_gaze(block)[4:])
    with pytest.raises(StreamError, match="says 3 samples but carries"):
        decode_gaze(encode_gaze(block)[:-8])
    bad = GazeSamples.from_arrays([0.0, np.inf], [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(StreamError, match="non-finite timestamps"):
        decode_gaze(encode_gaze(bad))
