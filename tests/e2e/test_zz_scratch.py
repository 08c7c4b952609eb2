import time
from tests.e2e.test_ui import dagster_dev  # noqa

def test_hold(dagster_dev, tmp_path):
    open("/tmp/dd_url", "w").write(f"{dagster_dev['url']} {dagster_dev['home']} {dagster_dev['log']}")
    while not __import__("os").path.exists("/tmp/dd_stop"):
        time.sleep(1)
