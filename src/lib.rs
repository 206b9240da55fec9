//! Test kit: real `redis-server` processes on free loopback ports, and a TCP fault proxy.
