#!/usr/bin/env bash
# A one-node Slurm cluster on localhost for tests/integration/test_slurm.py: Debian's slurm-wlm (22.05 on
# bookworm) with munge, and slurmdbd on a local MariaDB so that `sacct` lists finished jobs
# (22.05 has no file-based accounting storage left; jobcomp/filetxt is not read by sacct).
# The node offers a `gpu` generic resource with a count and no device files, so jobs can ask
# for GPUs on a machine without any.
#
# Idempotent: installs what is missing, (re)writes the configuration, starts each daemon that
# is not running, then waits until `sinfo` shows the node idle. Runs as root; no systemd needed.
# State and logs: $CELLBENCH_SLURM_DIR (default /var/lib/cellbench-ci/slurm).
set -euo pipefail

STATE=${CELLBENCH_SLURM_DIR:-/var/lib/cellbench-ci/slurm}
GPUS=${CELLBENCH_SLURM_GPUS:-2}
CLUSTER=cellbench
PARTITION=${CELLBENCH_SLURM_PARTITION:-debug}
NODE=$(hostname -s)

if [ "$(id -u)" != 0 ]; then
  echo "slurm-up: run as root (it installs packages and starts daemons)" >&2
  exit 2
fi

need=()
for pair in slurmctld:slurmctld slurmd:slurmd sacct:slurm-client slurmdbd:slurmdbd \
  munged:munge mariadbd:mariadb-server; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "slurm-up: installing ${need[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

mkdir -p "$STATE"/{ctld,spool,log} /etc/slurm /run/munge /run/mysqld
running() { pgrep -x "$1" >/dev/null 2>&1; }

# munge: one key per machine; the daemons and the clients authenticate through it.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1k count=1 status=none
fi
chown munge:munge /etc/munge/munge.key /run/munge
chmod 400 /etc/munge/munge.key
running munged || runuser -u munge -- /usr/sbin/munged

# MariaDB for slurmdbd (local socket, root by unix_socket auth).
chown mysql:mysql /run/mysqld
if ! running mariadbd; then
  runuser -u mysql -- /usr/sbin/mariadbd --skip-networking=0 --bind-address=127.0.0.1 \
    >"$STATE/log/mariadb.log" 2>&1 &
  for _ in $(seq 60); do mariadb -e 'select 1' >/dev/null 2>&1 && break; sleep 1; done
fi
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'cellbench-ci';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

cat >/etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=cellbench-ci
StorageLoc=slurm_acct_db
EOF
chmod 600 /etc/slurm/slurmdbd.conf
if ! running slurmdbd; then
  /usr/sbin/slurmdbd
  for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 1; done
fi

cpus=$(nproc)
# Leave a little memory to the machine itself; Slurm refuses a node claiming more than it has.
mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))

cat >/etc/slurm/slurm.conf <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# No cgroup setup is assumed (containers, CI runners): plain process tracking.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
ReturnToService=2
# Jobs stay visible to squeue for 10 min after they end (the plugin's status check reads them).
MinJobAge=600
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
# sacct shows the executor plugin's --comment (rule_<name>_wildcards_...): which job was which.
AccountingStoreFlags=job_comment
NodeName=$NODE CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
# GPUs without devices. Slurm 22.05 drops a file-less GPU ("Removing file-less GPU ... from
# final GRES list" in slurmd's log, then the node registers as INVALID, with Count= alone and
# with Flags=CountOnly), so each GPU gets a placeholder device node: Slurm schedules and
# accounts them and exports the allocation's indices (CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS)
# as on a real GPU node.
mkdir -p "$STATE/gpus"
for i in $(seq 0 $((GPUS - 1))); do
  # A character node with /dev/null's numbers (1,3): slurmd wants a device node, and this one
  # is harmless if anything does open it.
  [ -c "$STATE/gpus/gpu$i" ] || { rm -f "$STATE/gpus/gpu$i"; mknod -m 666 "$STATE/gpus/gpu$i" c 1 3; }
done
cat >/etc/slurm/gres.conf <<EOF
NodeName=$NODE Name=gpu File=$STATE/gpus/gpu[0-$((GPUS - 1))]
EOF

# The cluster, an account and root's association, so sacct/sacctmgr answer and the executor
# plugin finds a default account.
sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
sacctmgr -i add account cellbench Cluster="$CLUSTER" >/dev/null 2>&1 || true
sacctmgr -i add user root Account=cellbench DefaultAccount=cellbench >/dev/null 2>&1 || true

if running slurmctld; then
  scontrol reconfigure
else
  /usr/sbin/slurmctld
fi
running slurmd || /usr/sbin/slurmd

for _ in $(seq 60); do
  state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
  case "$state" in
    idle | mix | alloc) break ;;
    down* | drain*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
case "$state" in
  idle | mix | alloc) ;;
  *)
    echo "slurm-up: node $NODE is '$state', not idle; logs in $STATE/log" >&2
    exit 1
    ;;
esac
sinfo
echo "slurm-up: cluster $CLUSTER, partition $PARTITION, node $NODE ($cpus CPUs, ${mem_mb} MB, gpu:$GPUS); logs in $STATE/log"
