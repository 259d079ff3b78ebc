"""String ops against the ONNX reference evaluator / onnxruntime."""

import numpy as np
import pytest

from tests.oracle import check_node, make_node_model, run_actorrt


def _s(*items, shape=None):
    a = np.empty(len(items), dtype=object)
    a[:] = list(items)
    return a.reshape(shape) if shape is not None else a


def test_string_concat_broadcast():
    check_node("StringConcat", {"a": _s("a", "bc", "", "é", shape=(2, 2)),
                                "b": _s("!", "?")}, opset=20)


def test_string_concat_scalar():
    check_node("StringConcat", {"a": _s("ab", shape=()), "b": _s("cd", shape=())}, opset=20,
               peer="ort")


@pytest.mark.parametrize("delimiter,maxsplit", [
    ("", None), (" ", None), ("-", None), ("--", 1), ("", 1), (",", 0)])
def test_string_split(delimiter, maxsplit):
    x = _s("a b  c", " lead trail ", "x-y--z", "", "one", "p,q,,r", shape=(2, 3))
    attrs = {"delimiter": delimiter}
    if maxsplit is not None:
        attrs["maxsplit"] = maxsplit
    check_node("StringSplit", {"x": x}, outputs=("y", "z"), opset=20, **attrs)


def test_string_split_empty_input():
    x = np.empty((0,), dtype=object)
    y, z = run_actorrt(make_node_model("StringSplit", {"x": x}, ["y", "z"], opset=20), {"x": x})
    assert y.shape == (0, 0) and z.shape == (0,) and z.dtype == np.int64


@pytest.mark.parametrize("pattern", [r"\w+@\w+\.com", r"a.*b", r"[0-9]{2,3}", r"(ab)+|c"])
def test_regex_full_match(pattern):
    x = _s("me@site.com", "aXXb", "123", "1234", "abab", "c", "", "you@site.org", shape=(2, 4))
    check_node("RegexFullMatch", {"x": x}, opset=20, pattern=pattern)


def test_regex_bad_pattern_declined():
    x = _s("a")
    with pytest.raises(Exception, match="does not compile"):
        run_actorrt(make_node_model("RegexFullMatch", {"x": x}, ["y"], opset=20,
                                    pattern="(unclosed"), {"x": x})


@pytest.mark.parametrize("case,sensitive,stop", [
    ("NONE", 0, ["monday"]), ("LOWER", 1, ["Monday"]), ("UPPER", 0, ["MONDAY", "tuesday"]),
    ("UPPER", 1, []), ("LOWER", 0, ["monday", "tuesday", "wednesday"])])
@pytest.mark.parametrize("two_d", [False, True])
def test_string_normalizer(case, sensitive, stop, two_d):
    x = _s("Monday", "tuesday", "WEDNESDAY", "monday")
    if two_d:
        x = x.reshape(1, -1)
    # onnxruntime needs an installed locale for the default en_US.UTF-8; "C" suffices
    # for ASCII text
    attrs = {"case_change_action": case, "is_case_sensitive": sensitive, "locale": "C"}
    if stop:
        attrs["stopwords"] = stop
    check_node("StringNormalizer", {"x": x}, opset=10, peer="ort", **attrs)


# ------------------------------------------------------------------- TfIdf

_POOL_INTS = dict(ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
                  pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("min_n,max_n,skip", [(1, 1, 0), (2, 2, 0), (1, 2, 0), (2, 2, 5),
                                              (1, 2, 3)])
@pytest.mark.parametrize("batch", [False, True])
def test_tfidf_int(mode, min_n, max_n, skip, batch):
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)
    if batch:
        x = x.reshape(2, 6)
    attrs = dict(_POOL_INTS, mode=mode, min_gram_length=min_n, max_gram_length=max_n,
                 max_skip_count=skip)
    if mode != "TF":
        attrs["weights"] = [0.5, 1.0, 2.0, 3.0, 1.5, 0.25, 4.0]
    check_node("TfIdfVectorizer", {"x": x}, opset=9, **attrs)


@pytest.mark.parametrize("skip", [0, 2])
def test_tfidf_strings(skip):
    x = _s("a", "b", "c", "a", "b", "d", "b", "c", "zz", "a", shape=(2, 5))
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=3, max_skip_count=skip,
                 ngram_counts=[0, 3, 5, 7], ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 7],
                 pool_strings=["a", "b", "c", "a", "b", "b", "c", "a", "b", "c"])
    check_node("TfIdfVectorizer", {"x": x}, opset=9, **attrs)


def test_tfidf_empty_batch_rows():
    x = np.zeros((2, 0), np.int64)
    attrs = dict(_POOL_INTS, mode="TF", min_gram_length=1, max_gram_length=2,
                 max_skip_count=0)
    (y,) = run_actorrt(make_node_model("TfIdfVectorizer", {"x": x}, ["y"], opset=9, **attrs),
                       {"x": x})
    assert y.shape == (2, 7) and y.dtype == np.float32 and not y.any()
