// Triton backend `toolkit_synthetic`: streams tokens at a configured TTFT and ITL, with no model behind it.
//
// The C++ twin of python_models/synthetic.py, for calibrating load generators at high concurrency.
// The python backend takes requests into its stub process one `execute` at a time (~0.5 ms each on a
// small CPU), so 256 requests sent at once reach the python model up to ~130 ms late and the server
// really answers late. Here `execute` only reads max_tokens, takes a response factory and releases the
// request (microseconds); one scheduler thread sends every stream's tokens on an absolute schedule:
// token k of a request at arrival + ttft + k * itl, so delays do not accumulate.
//
// Same tensors as the ensemble (text_input, max_tokens, stream, ignore_eos -> text_output,
// output_token_count); only max_tokens is read. Parameters: ttft_ms, itl_ms (model config).
//
// Built by toolkit/repo/native.py with the system C++ compiler; it declares the few Triton C API
// functions it uses below (server API 1.x, backend API 1.x) instead of needing Triton's headers, and
// resolves them from the tritonserver process that loads it.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

extern "C" {
struct TRITONSERVER_Error;
struct TRITONSERVER_Message;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_ResponseFactory;
struct TRITONBACKEND_Output;
struct TRITONBACKEND_Backend;

// Values of tritonserver.h's enums that this backend uses.
enum { kErrorInternal = 1, kErrorInvalidArg = 3, kErrorUnsupported = 5 };
enum { kTypeInt32 = 8, kTypeBytes = 13 };
enum { kMemoryCpu = 0 };
enum { kRequestReleaseAll = 1 };
enum { kResponseCompleteFinal = 1 };

TRITONSERVER_Error* TRITONSERVER_ErrorNew(int code, const char* msg);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base,
                                                        size_t* byte_size);
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);

TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, uint32_t config_version,
                                              TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                     TRITONBACKEND_Model** model);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, bool success, uint64_t exec_start_ns,
    uint64_t compute_start_ns, uint64_t compute_end_ns, uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, uint64_t batch_size, uint64_t exec_start_ns, uint64_t compute_start_ns,
    uint64_t compute_end_ns, uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name,
                                               TRITONBACKEND_Input** input);
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                              uint64_t* buffer_byte_size, int* memory_type,
                                              int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory** factory,
                                                     TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory* factory,
                                                             bool* is_cancelled);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory* factory,
                                                           uint32_t send_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response** response,
                                                         TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response, TRITONBACKEND_Output** output,
                                                 const char* name, int datatype, const int64_t* shape,
                                                 uint32_t dims_count);
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer,
                                               uint64_t buffer_byte_size, int* memory_type,
                                               int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, uint32_t send_flags,
                                               TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response);
}

namespace {

using Clock = std::chrono::steady_clock;

// The text of every token: the same " tok" the python twin sends.
const char kToken[] = " tok";

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Errors from calls whose failure only means "the client went away": drop them.
void Ignore(TRITONSERVER_Error* error) {
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
}

// The number in `"<key>":{"string_value":"<number>"}` of the model config's JSON, or `fallback`.
double ConfigParameter(const std::string& json, const std::string& key, double fallback) {
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return fallback;
  const std::string marker = "\"string_value\":\"";
  at = json.find(marker, at);
  if (at == std::string::npos) return fallback;
  return std::strtod(json.c_str() + at + marker.size(), nullptr);
}

struct Stream {
  TRITONBACKEND_ResponseFactory* factory;
  Clock::time_point first_token;
  int32_t tokens;
  int32_t sent;
};

struct Due {
  Clock::time_point when;
  Stream* stream;
  bool operator>(const Due& other) const { return when > other.when; }
};

class Scheduler {
 public:
  Scheduler(double ttft_ms, double itl_ms)
      : ttft_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ttft_ms))),
        itl_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(itl_ms))),
        worker_(&Scheduler::Run, this) {}

  ~Scheduler() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }

  void Add(TRITONBACKEND_ResponseFactory* factory, Clock::time_point arrival, int32_t tokens) {
    Stream* stream = new Stream{factory, arrival + ttft_, std::max(tokens, 1), 0};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      due_.push(Due{stream->first_token, stream});
    }
    wake_.notify_one();
  }

 private:
  void Run() {
    std::vector<Stream*> ready;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      if (stopping_) break;
      if (due_.empty()) {
        wake_.wait(lock);
        continue;
      }
      const Clock::time_point next = due_.top().when;
      if (Clock::now() < next) {
        wake_.wait_until(lock, next);
        continue;
      }
      const Clock::time_point now = Clock::now();
      while (!due_.empty() && due_.top().when <= now) {
        ready.push_back(due_.top().stream);
        due_.pop();
      }
      lock.unlock();  // send without holding the lock: execute() keeps adding streams meanwhile
      std::vector<Due> again;
      for (Stream* stream : ready) {
        if (SendNext(stream)) {
          again.push_back(Due{stream->first_token + stream->sent * itl_, stream});
        } else {
          Ignore(TRITONBACKEND_ResponseFactoryDelete(stream->factory));
          delete stream;
        }
      }
      ready.clear();
      lock.lock();
      for (const Due& d : again) due_.push(d);
    }
    // Unloading: end every open stream so no client waits forever.
    while (!due_.empty()) {
      Stream* stream = due_.top().stream;
      due_.pop();
      Ignore(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, kResponseCompleteFinal));
      Ignore(TRITONBACKEND_ResponseFactoryDelete(stream->factory));
      delete stream;
    }
  }

  // Sends the stream's next token; false when the stream is over (last token sent or client gone).
  bool SendNext(Stream* stream) {
    bool cancelled = false;
    Ignore(TRITONBACKEND_ResponseFactoryIsCancelled(stream->factory, &cancelled));
    if (cancelled) {
      Ignore(TRITONBACKEND_ResponseFactorySendFlags(stream->factory, kResponseCompleteFinal));
      return false;
    }
    const bool last = stream->sent + 1 >= stream->tokens;
    TRITONBACKEND_Response* response = nullptr;
    if (TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory) != nullptr) return false;
    const int64_t shape[2] = {1, 1};
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    int memory_type = kMemoryCpu;
    int64_t memory_id = 0;
    // BYTES elements are a 4-byte little-endian length followed by the bytes.
    const uint32_t length = sizeof(kToken) - 1;
    if (TRITONBACKEND_ResponseOutput(response, &output, "text_output", kTypeBytes, shape, 2) == nullptr &&
        TRITONBACKEND_OutputBuffer(output, &buffer, 4 + length, &memory_type, &memory_id) == nullptr) {
      std::memcpy(buffer, &length, 4);
      std::memcpy(static_cast<char*>(buffer) + 4, kToken, length);
    }
    if (TRITONBACKEND_ResponseOutput(response, &output, "output_token_count", kTypeInt32, shape, 2) == nullptr &&
        TRITONBACKEND_OutputBuffer(output, &buffer, 4, &memory_type, &memory_id) == nullptr) {
      const int32_t one = 1;
      std::memcpy(buffer, &one, 4);
    }
    stream->sent += 1;
    TRITONSERVER_Error* error = TRITONBACKEND_ResponseSend(response, last ? kResponseCompleteFinal : 0, nullptr);
    if (error != nullptr) {
      TRITONSERVER_ErrorDelete(error);
      Ignore(TRITONBACKEND_ResponseDelete(response));
      return false;
    }
    return !last;
  }

  const Clock::duration ttft_;
  const Clock::duration itl_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due_;
  bool stopping_ = false;
  std::thread worker_;  // last: starts after the members it uses exist
};

// max_tokens of a request, or an error naming what is wrong with it.
TRITONSERVER_Error* MaxTokens(TRITONBACKEND_Request* request, int32_t* tokens) {
  TRITONBACKEND_Input* input = nullptr;
  if (TRITONBACKEND_RequestInput(request, "max_tokens", &input) != nullptr) {
    return TRITONSERVER_ErrorNew(kErrorInvalidArg, "synthetic model: the request has no max_tokens input");
  }
  const void* buffer = nullptr;
  uint64_t size = 0;
  int memory_type = kMemoryCpu;
  int64_t memory_id = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &memory_type, &memory_id);
  if (error != nullptr) return error;
  if (size < sizeof(int32_t) || memory_type != kMemoryCpu) {
    return TRITONSERVER_ErrorNew(kErrorInvalidArg, "synthetic model: max_tokens must be one INT32 in CPU memory");
  }
  std::memcpy(tokens, buffer, sizeof(int32_t));
  return nullptr;
}

void FailRequest(TRITONBACKEND_Request* request, TRITONSERVER_Error* error) {
  TRITONBACKEND_Response* response = nullptr;
  if (TRITONBACKEND_ResponseNew(&response, request) == nullptr) {
    Ignore(TRITONBACKEND_ResponseSend(response, kResponseCompleteFinal, error));
  }
  TRITONSERVER_ErrorDelete(error);
}

}  // namespace

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0, minor = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor);
  if (error != nullptr) return error;
  if (major != 1) {
    return TRITONSERVER_ErrorNew(kErrorUnsupported,
                                 "toolkit_synthetic backend is written for Triton backend API 1.x");
  }
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  TRITONSERVER_Message* message = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelConfig(model, 1, &message);
  if (error != nullptr) return error;
  const char* base = nullptr;
  size_t size = 0;
  error = TRITONSERVER_MessageSerializeToJson(message, &base, &size);
  if (error != nullptr) return error;
  const std::string json(base, size);
  Ignore(TRITONSERVER_MessageDelete(message));
  const double ttft_ms = ConfigParameter(json, "ttft_ms", 100.0);
  const double itl_ms = ConfigParameter(json, "itl_ms", 20.0);
  if (!(ttft_ms >= 0.0) || !(itl_ms >= 0.0)) {
    return TRITONSERVER_ErrorNew(kErrorInvalidArg, "synthetic model: ttft_ms and itl_ms must be >= 0");
  }
  return TRITONBACKEND_ModelSetState(model, new Scheduler(ttft_ms, itl_ms));
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &state);
  if (error != nullptr) return error;
  delete static_cast<Scheduler*>(state);
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  const Clock::time_point arrival = Clock::now();
  const uint64_t start_ns = NowNs();
  TRITONBACKEND_Model* model = nullptr;
  void* state = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (error == nullptr) error = TRITONBACKEND_ModelState(model, &state);
  if (error != nullptr) return error;  // Triton then fails and releases the requests itself
  Scheduler* scheduler = static_cast<Scheduler*>(state);
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Request* request = requests[i];
    int32_t tokens = 0;
    TRITONBACKEND_ResponseFactory* factory = nullptr;
    error = MaxTokens(request, &tokens);
    if (error == nullptr) error = TRITONBACKEND_ResponseFactoryNew(&factory, request);
    const uint64_t end_ns = NowNs();
    Ignore(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, error == nullptr, start_ns, start_ns,
                                                       end_ns, end_ns));
    if (error != nullptr) {
      FailRequest(request, error);
    } else {
      scheduler->Add(factory, arrival, tokens);
    }
    Ignore(TRITONBACKEND_RequestRelease(request, kRequestReleaseAll));
  }
  const uint64_t end_ns = NowNs();
  Ignore(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, start_ns, start_ns, end_ns, end_ns));
  return nullptr;
}

}  // extern "C"
