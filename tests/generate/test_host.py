"""Engine settings resolved from the host: what each CPU kind gets, and explicit settings winning."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from ragserve.config import GeneratorSettings
from ragserve.errors import ConfigError
from ragserve.generate.host import HostCpu, cpu_list, read_host_cpu, resolve_engine

ZEN3 = HostCpu("AMD EPYC", frozenset({"avx", "avx2", "fma"}), (0, 1))
SAPPHIRE_RAPIDS = HostCpu(
    "Intel Xeon", frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile"}), (0, 1)
)
BIG_HOST = HostCpu("Intel Xeon", frozenset({"avx2", "avx512f"}), tuple(range(16)))


def _choice(resolved, name: str) -> str:
    return next(c.value for c in resolved.choices if c.name == name)


def test_avx2_host_gets_float32_all_cores_and_small_blocks() -> None:
    resolved = resolve_engine(GeneratorSettings(speculative="off"), ZEN3)
    assert resolved.dtype == "float32"
    assert resolved.omp_threads_bind == "0-1"
    assert resolved.block_size == 32
    assert "emulated" in resolved.summary()


def test_no_binding_is_claimed_for_an_engine_on_a_server_thread() -> None:
    resolved = resolve_engine(GeneratorSettings(), ZEN3)
    assert resolved.engine_layout == "thread"
    assert resolved.omp_threads_bind == ""
    assert _choice(resolved, "omp_threads_bind") == "none"
    assert _choice(resolved, "threads") == "auto (up to 2)"
    fixed = resolve_engine(GeneratorSettings(threads=1), ZEN3)
    assert _choice(fixed, "threads") == "1"


def test_an_engine_core_process_has_no_thread_count_to_adapt() -> None:
    resolved = resolve_engine(GeneratorSettings(engine_layout="process"), ZEN3)
    assert all(c.name != "threads" for c in resolved.choices)


def test_native_bf16_host_keeps_bf16() -> None:
    resolved = resolve_engine(GeneratorSettings(), SAPPHIRE_RAPIDS)
    assert resolved.dtype == "bfloat16"
    assert "avx512_bf16" in next(c.reason for c in resolved.choices if c.name == "dtype")


def test_large_host_keeps_vllm_auto_binding() -> None:
    resolved = resolve_engine(GeneratorSettings(), BIG_HOST)
    assert resolved.omp_threads_bind == ""
    assert _choice(resolved, "omp_threads_bind") == "auto"


def test_explicit_settings_win() -> None:
    settings = GeneratorSettings(
        dtype="bfloat16",
        cpu_omp_threads_bind="1",
        block_size=128,
        speculative="ngram",
        engine_layout="process",
        weights="float",
    )
    resolved = resolve_engine(settings, ZEN3)
    assert (resolved.dtype, resolved.omp_threads_bind, resolved.block_size) == ("bfloat16", "1", 128)
    assert resolved.engine_layout == "process"
    assert all("set by RAGSERVE_GENERATOR_" in c.reason for c in resolved.choices)


def test_block_size_must_suit_the_cpu_backend() -> None:
    with pytest.raises(ConfigError, match="multiple of 32"):
        resolve_engine(GeneratorSettings(block_size=48), ZEN3)


def test_gpu_leaves_dtype_and_blocks_to_vllm() -> None:
    resolved = resolve_engine(GeneratorSettings(device="cuda"), ZEN3)
    assert (resolved.dtype, resolved.omp_threads_bind, resolved.block_size) == ("auto", "", None)


def test_cpu_list_compacts_runs() -> None:
    assert cpu_list((0, 1)) == "0-1"
    assert cpu_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert cpu_list((3,)) == "3"


def test_reads_model_and_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    host = read_host_cpu(info)
    assert host.model == "AMD EPYC" and "avx2" in host.flags and not host.native_bf16
    assert "avx2" in host.describe()


def test_unreadable_cpuinfo_means_the_safe_choice(tmp_path: Path) -> None:
    host = read_host_cpu(tmp_path / "missing")
    assert resolve_engine(GeneratorSettings(), host).dtype == "float32"


def test_speculation_is_on_by_default_only_where_it_was_measured_to_pay() -> None:
    small_cpu = resolve_engine(GeneratorSettings(), ZEN3)
    assert small_cpu.speculative_config is not None and small_cpu.engine_layout == "thread"
    assert _choice(small_cpu, "speculative").startswith("ngram")
    assert resolve_engine(GeneratorSettings(device="cuda"), ZEN3).speculative_config is None
    assert resolve_engine(GeneratorSettings(), BIG_HOST).speculative_config is None
    beside_core_process = resolve_engine(GeneratorSettings(engine_layout="process"), ZEN3)
    assert beside_core_process.speculative_config is None
    assert "engine-core process" in next(c.reason for c in beside_core_process.choices if c.name == "speculative")
    assert resolve_engine(GeneratorSettings(speculative="off"), ZEN3).speculative_config is None


def test_speculation_settings_are_passed_as_asked() -> None:
    asked = resolve_engine(GeneratorSettings(speculative="ngram", speculative_tokens=3), BIG_HOST)
    assert asked.speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    assert _choice(asked, "speculative").startswith("ngram")


def test_lookup_window_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="PROMPT_LOOKUP_MIN"):
        GeneratorSettings(prompt_lookup_min=5, prompt_lookup_max=3)


def test_engine_layout_follows_speculation_on_cpu_only() -> None:
    plain = resolve_engine(GeneratorSettings(speculative="off"), ZEN3)
    assert plain.engine_layout == "process"
    speculating = resolve_engine(GeneratorSettings(speculative="ngram"), ZEN3)
    assert speculating.engine_layout == "thread"
    assert "engine-core process" in next(c.reason for c in speculating.choices if c.name == "engine_layout")
    gpu = resolve_engine(GeneratorSettings(device="cuda", speculative="ngram"), ZEN3)
    assert gpu.engine_layout == "process"
    assert resolve_engine(GeneratorSettings(speculative="ngram"), BIG_HOST).engine_layout == "process"
    assert resolve_engine(GeneratorSettings(engine_layout="thread"), ZEN3).engine_layout == "thread"


def _prepared_int8(folder: Path) -> Path:
    """A float model folder and an int8 export beside it, both marked prepared (no weights: only
    the choice is under test)."""
    from ragserve.generate.model_prep import int8_folder

    for path in (folder, int8_folder(folder)):
        path.mkdir(parents=True)
        (path / "config.json").write_text("{}")
        (path / "ragserve-prepared.json").write_text("{}")
    return int8_folder(folder)


def test_int8_weights_are_served_where_asked_for_and_exported(tmp_path: Path) -> None:
    model = tmp_path / "SmolLM2"
    # The float folder by default, whatever the CPU, saying how to get the other.
    default = resolve_engine(GeneratorSettings(model=str(model)), SAPPHIRE_RAPIDS)
    assert default.model == str(model) and "RAGSERVE_GENERATOR_WEIGHTS=int8" in default.summary()
    asked = GeneratorSettings(model=str(model), weights="int8")
    with pytest.raises(ConfigError, match="prepare-models --int8"):
        resolve_engine(asked, SAPPHIRE_RAPIDS)  # asked for, not exported: the server does not start
    int8 = _prepared_int8(model)
    assert resolve_engine(GeneratorSettings(model=str(model)), SAPPHIRE_RAPIDS).model == str(model)
    for host in (SAPPHIRE_RAPIDS, ZEN3):
        resolved = resolve_engine(asked, host)
        assert resolved.model == str(int8) and _choice(resolved, "weights") == "int8"


def test_a_hub_model_has_no_int8_export_to_serve() -> None:
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_engine(GeneratorSettings(model=hub), SAPPHIRE_RAPIDS).model == hub
    with pytest.raises(ConfigError, match="no int8 export"):
        resolve_engine(GeneratorSettings(model=hub, weights="int8"), SAPPHIRE_RAPIDS)
