import json

import pytest

from kiln.planning.data import data_sufficiency


def test_natural_mixture_repeats_every_source_equally():
    result = data_sufficiency(300e9, {"web": 100e9, "code": 50e9})
    assert [s.epochs for s in result.sources] == pytest.approx([2.0, 2.0])
    assert result.sufficient and not result.warnings


def test_weights_and_the_four_epoch_warning():
    result = data_sufficiency(100e9, {"web": 100e9, "books": 5e9}, {"web": 0.8, "books": 0.2})
    epochs = {s.source: s.epochs for s in result.sources}
    assert epochs == pytest.approx({"web": 0.8, "books": 4.0})
    assert result.sufficient  # exactly 4 epochs is still fine (Muennighoff et al. 2023)
    result = data_sufficiency(100e9, {"web": 100e9, "books": 4e9}, {"web": 0.8, "books": 0.2})
    assert not result.sufficient
    assert len(result.warnings) == 1 and "'books'" in result.warnings[0] and "5.0 times" in result.warnings[0]


def test_unweighted_source_is_not_used():
    result = data_sufficiency(10e9, {"web": 100e9, "spare": 1e9}, {"web": 1.0})
    assert {s.source: s.needed_tokens for s in result.sources} == {"web": 10e9, "spare": 0.0}


def test_weights_for_unknown_sources_are_rejected():
    with pytest.raises(ValueError, match="wiki"):
        data_sufficiency(10e9, {"web": 100e9}, {"wiki": 1.0})


def test_a_weighted_source_without_tokens_is_named_and_its_json_is_strict():
    """A source the mixture weights but that holds no tokens (every document filtered out, or a removal request for
    all of it) cannot supply its share at any number of epochs. Its epochs were infinite, which strict JSON cannot
    hold: `kiln plan --json` died with a traceback, and the warning read "would be repeated inf times"."""
    result = data_sufficiency(10e9, {"web": 100e9, "code": 0.0}, {"web": 0.5, "code": 0.5})
    assert not result.sufficient
    web, code = result.to_dict()["sources"]
    assert (web["needed_tokens"], web["epochs"]) == (5e9, 0.05)  # 10e9 x 0.5 over 100e9 available
    assert (code["needed_tokens"], code["epochs"]) == (5e9, None)
    json.dumps(result.to_dict(), allow_nan=False)
    assert result.warnings == ["source 'code' has no tokens available but a mixture weight of 0.50: it cannot supply "
                               "its 5e+09 tokens at any number of epochs; add data to it or set its weight to 0"]
