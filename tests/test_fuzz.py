"""Bad input never yields a traceback: fuzzed --set items and sweep files parse or fail in one line."""

import re
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cifar_ray.cli import main
from cifar_ray.core.config import KEYS, ConfigError, parse_config, parse_overrides
from cifar_ray.core.strict_yaml import load_yaml
from cifar_ray.core.sweep import NAME_MAX, NAME_PATTERN, TRIAL_NAME_MAX, build_plan, trial_name

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["auto", "true", "false", "sgd", "adam", "ddp", "dp", "bf16", "fp16", "synthetic", "none"]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(string.ascii_letters + "_", min_size=1, max_size=10))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=2))


def one_line(error: Exception) -> bool:
    return bool(str(error)) and "\n" not in str(error)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=4))
def test_set_items_parse_or_fail_in_one_line(items):
    try:
        parse_config(parse_overrides(items))
    except ConfigError as error:
        assert one_line(error)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=6))
def test_config_dicts_parse_or_fail_in_one_line(values_by_key):
    try:
        parse_config(values_by_key)
    except ConfigError as error:
        assert one_line(error)


sweep_docs = st.one_of(
    values,
    st.fixed_dictionaries(
        {"name": st.one_of(st.just("fuzz"), st.text(max_size=8), scalars)},
        optional={
            "base": st.one_of(st.dictionaries(keys, scalars, max_size=4), scalars),
            "grid": st.one_of(
                st.dictionaries(
                    keys,
                    st.one_of(
                        st.lists(scalars, max_size=3),
                        st.lists(st.dictionaries(keys, scalars, max_size=2), max_size=2),
                        scalars,
                    ),
                    max_size=3,
                ),
                scalars,
            ),
            "repeats": scalars,
            "metric": scalars,
            "mode": scalars,
            "extra": scalars,
        },
    ),
)


@settings(max_examples=300, deadline=None)
@given(sweep_docs)
def test_sweep_documents_parse_or_fail_in_one_line(document):
    try:
        plan = build_plan(document, source="fuzz.yaml")
        assert plan.trials
    except ConfigError as error:
        assert one_line(error) and "fuzz.yaml" in str(error)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.text(max_size=80), sweep_docs.map(lambda d: yaml.safe_dump(d, default_flow_style=True))))
def test_sweep_files_never_trace_back(tmp_path, capsys, text):
    path = tmp_path / "fuzz.yaml"
    path.write_text(text)
    code = main(["sweep", str(path), "--dry-run"])
    captured = capsys.readouterr()
    assert code in (0, 2)
    assert "Traceback" not in captured.err
    if code == 2:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cifar-ray: error: ")


names = st.from_regex(NAME_PATTERN, fullmatch=True).filter(lambda name: len(name) <= NAME_MAX)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**4), st.dictionaries(st.one_of(st.sampled_from(KEYS), names), scalars, max_size=4))
def test_trial_names_are_one_name_whatever_the_values(index, swept):
    """Values go into trial folder names (a data_dir with /, a bundle label with spaces): never a nested folder."""
    name = trial_name(index, swept)
    assert re.fullmatch(NAME_PATTERN, name) and len(name) <= TRIAL_NAME_MAX


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_yaml_text_loads_or_fails_as_bad_yaml_or_one_line(text):
    try:
        load_yaml(text)
    except yaml.YAMLError:
        pass
    except ConfigError as error:
        assert one_line(error)
