"""bench/idx: reads a gzip'd IDX file (the Fashion-MNIST format) into a
numpy array. A module of its own, importing nothing else, so that both
bench/train.py and bench/tf_ps.py (which runs inside TensorFlow's processes)
can use it."""
import gzip


def load_idx(path):
    """The array in the gzip'd IDX file at path, uint8, in its dimensions."""
    import numpy as np
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
