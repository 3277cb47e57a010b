"""The gRPC request the sweep sends and how it reads Triton's stream responses (raw protobuf, no server)."""

import struct

import numpy as np
from tritonclient.grpc import service_pb2

from toolkit.bench.clients import ensemble_request, read_stream_response


def test_ensemble_request_carries_the_ensemble_tensors_as_tritonclient_would():
    from tritonclient.grpc import InferInput

    request = ensemble_request("ensemble", "héllo", 17, ignore_eos=False, request_id="42")
    assert request.model_name == "ensemble" and request.id == "42"
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("text_input", "BYTES", [1, 1]), ("max_tokens", "INT32", [1, 1]),
        ("stream", "BOOL", [1, 1]), ("ignore_eos", "BOOL", [1, 1])]
    # byte-for-byte what tritonclient's InferInput produces for the same values
    expected = []
    for name, array, dtype in (("text_input", np.array([["héllo".encode()]], dtype=object), "BYTES"),
                               ("max_tokens", np.array([[17]], dtype=np.int32), "INT32"),
                               ("stream", np.array([[True]]), "BOOL"),
                               ("ignore_eos", np.array([[False]]), "BOOL")):
        tensor = InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        expected.append(tensor._get_content())
    assert list(request.raw_input_contents) == expected
    assert request.parameters["triton_enable_empty_final_response"].bool_param


def _response(texts=None, counts=None, final=False):
    response = service_pb2.ModelStreamInferResponse()
    result = response.infer_response
    if texts is not None:
        result.outputs.add(name="text_output", datatype="BYTES", shape=[1, len(texts)])
        result.raw_output_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in texts))
    if counts is not None:
        result.outputs.add(name="output_token_count", datatype="INT32", shape=[1, len(counts)])
        result.raw_output_contents.append(struct.pack(f"<{len(counts)}i", *counts))
    result.parameters["triton_final_response"].bool_param = final
    return response


def test_stream_responses_give_text_count_and_final():
    assert read_stream_response(_response([b" to", b"k"], [2])) == (" tok", 2, False, None)
    assert read_stream_response(_response([b"!"], [1], final=True)) == ("!", 1, True, None)
    # the empty final response (no outputs) ends the request without adding a token
    assert read_stream_response(_response(final=True)) == (None, None, True, None)
    # a token that is part of a UTF-8 character does not break decoding
    assert read_stream_response(_response([b"\xc3"], [1]))[0] == "\ufffd"


def test_a_server_error_is_final_and_named():
    response = service_pb2.ModelStreamInferResponse(error_message="in ensemble 'ensemble', max_tokens must be > 0")
    assert read_stream_response(response) == (None, None, True, "in ensemble 'ensemble', max_tokens must be > 0")
