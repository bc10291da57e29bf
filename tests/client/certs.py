"""Certificates made at test time with openssl: a CA, a server certificate and a client one."""
import os
import subprocess


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed(directory, name, subject, extensions):
    """name.key and name.crt, signed by ca.key, with `extensions` (openssl x509 -extfile lines)."""
    with open(os.path.join(directory, f"{name}.ext"), "w") as f:
        f.write("\n".join(extensions) + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
             cwd=directory)


def make_certs(directory, server_names=("praxis-serve", "localhost")):
    """Writes ca.{crt,key}, server.{crt,key} (DNS `server_names` and IP 127.0.0.1) and
    client.{crt,key} under `directory`; returns {name: path} for those six files."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=praxis test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    sans = ",".join([f"DNS:{n}" for n in server_names] + ["IP:127.0.0.1"])
    _signed(directory, "server", "/CN=praxis-serve",
            [f"subjectAltName={sans}", "extendedKeyUsage=serverAuth"])
    _signed(directory, "client", "/CN=praxis test robot", ["extendedKeyUsage=clientAuth"])
    return {f"{n}.{e}": os.path.join(directory, f"{n}.{e}")
            for n in ("ca", "server", "client") for e in ("crt", "key")}
