"""Plan tables the NFS tests share."""

DATASTORE_VM = """
# its disk on the export, opened by QEMU (libnfs: NFSv3, served with a private rpcbind)
[[environment]]
name = "vm-datastore"
kind = "vm"
accel = "tcg"
vcpus = 1
memory_mb = 512
nfs_access = "datastore"
datastore_mb = 256
"""
"""A TCG VM whose disk for the storage = "nfs" workloads is an image on the study's export."""
