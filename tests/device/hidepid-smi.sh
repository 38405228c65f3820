#!/usr/bin/env bash
# Issue 36, finding 6: what NVIDIA's nvidia-smi and NVML show a user about another user's
# GPU process, with /proc as it is and with /proc mounted hidepid=1, 2, invisible with a
# gid= exemption, and ptraceable (each in a private mount namespace: the host's /proc is
# left as it is). User 4401 holds 1 GiB on GPU 0 through PyTorch; 4402 (and 4401, and
# root) run nvidia-smi's process query and table and nvidia-ml-py's process list and
# process names. Adds two users and removes them. Run as root:
#   tests/device/hidepid-smi.sh > OUT.txt 2>&1
# (run as one `bash -c` on the device machine: results/hidepid-smi-h100-2026-12-06, where
# the holder was still ending when userdel ran; it now waits for it)
useradd -M -u 4401 ga;useradd -M -u 4402 gb
cat >/tmp/c.py <<'P'
import torch,time,os;x=torch.ones(1<<28,device='cuda');torch.cuda.synchronize();print('up',os.getpid(),flush=True);time.sleep(90)
P
cat >/tmp/n.py <<'P'
import pynvml as n;n.nvmlInit();h=n.nvmlDeviceGetHandleByIndex(0)
for p in n.nvmlDeviceGetComputeRunningProcesses(h):
  try: name=n.nvmlSystemGetProcessName(p.pid)
  except Exception as e: name='ERR '+repr(e)
  print('nvml',p.pid,p.usedGpuMemory,name)
P
chmod 644 /tmp/*.py
as(){ u=$1;shift;HOME=/tmp setpriv --reuid=$u --regid=$u --clear-groups "$@"; }
as 4401 python3 /tmp/c.py >/tmp/up 2>&1 &
holder=$!
for i in $(seq 60);do grep -q up /tmp/up && break;sleep 1;done;cat /tmp/up
q(){ echo "-- $1"; as $1 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv; as $1 nvidia-smi | tail -6; as $1 python3 /tmp/n.py 2>&1|tail -3; }
echo "== plain /proc";q 0;q 4402
export -f as q
for o in hidepid=1 hidepid=2 hidepid=invisible,gid=4402 hidepid=ptraceable;do echo "== $o";unshare -m bash -c "mount -t proc -o $o proc /proc && grep ' /proc ' /proc/self/mountinfo; ls -d /proc/[0-9]* | wc -l; q 4402; q 4401; q 0";done
kill $holder;wait $holder;userdel ga;userdel gb;uname -r;nvidia-smi --version|head -2
