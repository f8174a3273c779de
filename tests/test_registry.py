import pytest

from virtlab.registry import Registry, UnknownPluginError


def test_duplicates_are_refused_and_unknown_names_list_the_valid_ones():
    registry: Registry[object] = Registry("thing")
    registry.add("a", int)
    registry.add("a", int)  # the same plugin again (a module imported twice) is harmless
    with pytest.raises(ValueError, match="registered twice"):
        registry.add("a", str)
    registry.add("b", str)
    with pytest.raises(UnknownPluginError) as caught:
        registry.get("c")
    assert caught.value.valid == ["a", "b"]
    assert "valid: a, b" in str(caught.value)


def test_lazy_plugins_are_imported_only_when_asked_for():
    registry: Registry[object] = Registry("thing")
    registry.add_lazy("json-decoder", "json.decoder:JSONDecoder")
    assert registry.names() == ["json-decoder"]
    assert "json-decoder" in registry
    from json.decoder import JSONDecoder

    assert registry.get("json-decoder") is JSONDecoder
    with pytest.raises(ValueError):
        registry.add_lazy("json-decoder", "json:JSONDecoder")
