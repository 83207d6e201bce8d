"""MQTT bridge: subscribe at QoS 1 with a persistent session, publish to ``events.sensors``.

- :mod:`ingest.mqtt.mapping`: topic patterns with named wildcards -> device id and field;
- :mod:`ingest.mqtt.bridge`: the paho-mqtt client, acknowledgements and reconnects.
"""
