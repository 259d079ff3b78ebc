import numpy as np
import pytest

from tests.oracle import check_node


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_binary_broadcast(op):
    rng = np.random.default_rng(0)
    check_node(op, {"a": rng.standard_normal((2, 3, 4)).astype(np.float32),
                    "b": rng.standard_normal((3, 1)).astype(np.float32)})
