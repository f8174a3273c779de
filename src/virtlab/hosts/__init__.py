"""The lab's hosts: what they are (``model``), where they come from (a plan's ``[[host]]`` tables:
``tables``; an Ansible inventory: ``inventory``), how one is reached (``remote``), which libvirt
URIs virtlab connects to (``libvirt_uri``), and ``virtlab hosts`` (``cli``, imported only by the
command line; ``check`` is ``virtlab hosts check``).
"""

from virtlab.hosts.inventory import load_inventory
from virtlab.hosts.model import LOCAL, LOCAL_NAME, Host
from virtlab.hosts.remote import derived_libvirt_uri, host_libvirt_uri, host_problem, ssh_options
from virtlab.hosts.tables import HostTable

__all__ = [
    "LOCAL",
    "LOCAL_NAME",
    "Host",
    "HostTable",
    "derived_libvirt_uri",
    "host_libvirt_uri",
    "host_problem",
    "load_inventory",
    "ssh_options",
]
