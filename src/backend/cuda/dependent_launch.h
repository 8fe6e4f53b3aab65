// Programmatic dependent launch (Hopper and newer): whether our decode-path kernels may start
// while the kernel before them on the stream is still finishing. Host API only; the device side
// and the launch helper are in dependent_launch.cuh.
#pragma once

namespace tessera::cuda {

// On by default on compute capability 9.x (the sm_90a code has the device-side wait);
// TESSERA_CUDA_PDL=0 turns it off (to measure what it saves), TESSERA_CUDA_PDL=1 keeps it on. Any
// other value of the variable is refused with an error naming it, at the first call (the first
// dependent launch).
bool dependent_launch_enabled();
// Overrides the environment for the whole process (tests compare both settings). Graphs
// captured before the change keep the setting they were captured with.
void set_dependent_launch(bool on);

}  // namespace tessera::cuda
