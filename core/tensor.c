/* kvshim tensor: placeholder, being implemented. */
