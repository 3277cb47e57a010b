"""A quiet console: a stage prints its own result line, not what libraries print (unless --verbose)."""

from test_cli_errors import run_cli


def test_quantize_prints_only_its_result(tmp_path, tiny_model_dir):
    config = tmp_path / "c.yaml"
    config.write_text(f"name: quiet\nmodel:\n  source: {tiny_model_dir}\n  name: tiny\n"
                      f"quantize:\n  calib_size: 4\n  calib_seq_len: 32\npaths:\n  build_dir: {tmp_path / 'b'}\n")
    result = run_cli("quantize", "-c", str(config))
    assert result.returncode == 0, result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    # ModelOpt's version notice and quantizer count, torch/transformers deprecations, progress bars: none.
    assert len(lines) == 1 and lines[0].startswith("checkpoint: "), lines
