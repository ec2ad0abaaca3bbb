"""The descriptor pool that wok's generated stubs (wok.v2pb) add their files to.

Written by scripts/gen_protos.py. Not protobuf's default pool: tritonclient's stubs add the
same `inference.*` names there, and a process may import both.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
