// The drafters' gradient all-reduce as the training loop runs it (grad_reducer.h): the NCCL reducer on device
// memory and the MPI reducer staged through pinned host memory, for flat fp32 buffers of real drafter sizes.
// Tells whether overlapping the all-reduce with the backward would pay: compare its time to a drafter step.
// Run: mpirun -np N bench_grad_allreduce [floats ...] with N GPUs (rank r on GPU r % visible GPUs). With fewer
// GPUs than ranks, NCCL runs only when every rank has its own NCCL_HOSTID (mpirun -np N launch/nccl_hostid.sh
// bench_grad_allreduce): then it crosses NCCL's socket transport on loopback, a correctness run whose times
// say nothing of an interconnect, and the default sizes stop at 64 Mi floats.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "comm/grad_reducer.h"
#include "comm/nccl_comm.h"
#include "kernels/primitives/cuda_check.cuh"
#include "ops/cuda/cuda_device.h"

using namespace df;

namespace {

// Seconds per sum over `iters` calls after 2 warm-up calls. Every call multiplies the buffer by the world
// size (all ranks hold the same values), so the last one must hold world^(iters + 2) everywhere; a sample of
// 4096 evenly spaced elements is checked (fp32 holds powers of two exactly).
double time_sum(GradReducer& r, float* d, size_t n, int iters, cudaStream_t compute, int world, bool* ok) {
  std::vector<float> ones(std::min<size_t>(n, size_t(1) << 24), 1.0f);
  for (size_t off = 0; off < n; off += ones.size())
    DF_CUDA_CHECK(cudaMemcpy(d + off, ones.data(), std::min(ones.size(), n - off) * sizeof(float),
                             cudaMemcpyHostToDevice));
  for (int i = 0; i < 2; ++i) r.sum(d, n);
  DF_CUDA_CHECK(cudaStreamSynchronize(compute));
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) r.sum(d, n);
  DF_CUDA_CHECK(cudaStreamSynchronize(compute));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  float want = 1.0f;
  for (int i = 0; i < iters + 2; ++i) want *= float(world);
  const size_t samples = std::min<size_t>(n, 4096), stride = n / samples;
  std::vector<float> got(samples);
  DF_CUDA_CHECK(cudaMemcpy2D(got.data(), sizeof(float), d, stride * sizeof(float), sizeof(float), samples,
                             cudaMemcpyDeviceToHost));
  *ok = true;
  for (size_t i = 0; i < samples; ++i)
    if (got[i] != want) {
      std::fprintf(stderr, "WRONG: element %zu of %zu holds %g, expected %g\n", i * stride, n, got[i], want);
      *ok = false;
      break;
    }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 0;
  try {
    const int gpus = cuda_device_count();
    DF_CHECK(gpus > 0, "bench_grad_allreduce needs a CUDA GPU; none is visible");
    // 1.05 G and 1.73 G: the Qwen3-8B and Qwen3.6-27B drafters' trainable parameters (device/README.md).
    // Ranks sharing a GPU reach NCCL only as separate "hosts" (the socket test mode, comm/transport.h).
    const bool shared = world > gpus, nccl_ok = !shared || std::getenv("NCCL_HOSTID") != nullptr;
    std::vector<size_t> sizes = {size_t(1) << 20, size_t(64) << 20};
    if (!shared) sizes.insert(sizes.end(), {1050000000, 1730000000});
    if (argc > 1) sizes.clear();
    for (int i = 1; i < argc; ++i) sizes.push_back(size_t(std::strtod(argv[i], nullptr)));
    const int dev = rank % gpus;
    DF_CUDA_CHECK(cudaSetDevice(dev));
    std::unique_ptr<NcclComm> comm;
    if (nccl_ok) {
      comm = NcclComm::create(MPI_COMM_WORLD, dev, "drafters", {}, 600);
      comm->warm_up({});
    }
    cudaStream_t compute;
    DF_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    if (rank == 0)
      std::printf("%d ranks on %d GPUs%s; busbw = algbw * 2(N-1)/N (nccl-tests' all-reduce formula)\n", world,
                  gpus,
                  !nccl_ok ? " (NCCL skipped: it refuses two ranks on one GPU without NCCL_HOSTID per rank)"
                  : shared ? " (CORRECTNESS RUN: the ranks share a GPU, NCCL talks over sockets on loopback; "
                             "no figure below is an interconnect's)"
                           : "");
    for (size_t n : sizes) {
      float* d = nullptr;
      DF_CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
      struct Path {
        const char* name;
        std::unique_ptr<GradReducer> r;
        int iters;
      };
      std::vector<Path> paths;
      if (nccl_ok)
        paths.push_back({shared ? "nccl/socket" : "nccl", grad_reducer_nccl(*comm, compute, MPI_COMM_WORLD),
                         shared ? 3 : 10});
      paths.push_back({"mpi staged", grad_reducer_staged(MPI_COMM_WORLD, compute, n), 3});
      for (Path& p : paths) {
        bool ok = false;
        const double s = time_sum(*p.r, d, n, p.iters, compute, world, &ok);
        double lo = 0, hi = 0, sum = 0;
        MPI_Reduce(&s, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&s, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(&s, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        int all_ok = 0, mine = ok ? 1 : 0;
        MPI_Reduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, 0, MPI_COMM_WORLD);
        if (rank == 0) {
          const double bytes = double(n) * sizeof(float), algbw = bytes / hi / 1e9;
          std::printf(
              "%-12s %12zu floats (%7.3f GB): min %9.3f avg %9.3f max %9.3f ms, algbw %7.1f GB/s, "
              "busbw %7.1f GB/s (slowest rank), %s\n",
              p.name, n, bytes / 1e9, lo * 1e3, sum / world * 1e3, hi * 1e3, algbw,
              algbw * 2.0 * (world - 1) / world, all_ok ? "result checked" : "WRONG RESULT");
          if (!all_ok) rc = 1;
        }
      }
      paths.clear();
      DF_CUDA_CHECK(cudaFree(d));
    }
    cudaStreamDestroy(compute);
    comm.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] FATAL: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
